"""The anchors' endpoints, field for field: vLLM's /tokenize and /detokenize, llama.cpp's /tokenize (`content`,
`with_pieces`) and /apply-template, Anthropic's count_tokens and OpenAI's responses/input_tokens. Each is a function
of a served model and the parsed JSON body, run on a pool worker; the ids are ctxlock's exact ones.

Where ctxlock departs from an anchor it says so (docs/serve-compat.md lists each case): special-token text in a
prompt or message is text, except in llama.cpp's `content` with an explicit `parse_special: true` (the client's own
string, by its own choice; llama.cpp parses by default, and ctxlock's answer then carries a `warnings` field when the
content holds control-token text it kept as text); a request-supplied `chat_template` is refused unless the config
allows named templates (and then only a configured name); `chat_template_kwargs` cannot set a name the template
stage binds (the same `RESERVED_TEMPLATE_KWARGS` rule as the request files, on every route; CVE-2025-61620)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxlock.accounting._layout import count_format
from ctxlock.errors import RequestValidationError
from ctxlock.request import RESERVED_TEMPLATE_KWARGS
from ctxlock.request._anthropic import ignored_blocks
from ctxlock.request._openai import responses_request
from ctxlock.server.models import ServedModel
from ctxlock.template._options import RenderOptions

# Keys that would replace the template, or its inputs, if a request could set them through chat_template_kwargs:
# one set for every route (the request files' own rule). `chat_template` is in it; `template` is not: no peer reads a
# template from a template variable of that name, so it is an ordinary variable everywhere.
SMUGGLING_KEYS = RESERVED_TEMPLATE_KWARGS

VLLM_COMPLETION = {"model", "prompt", "add_special_tokens", "return_token_strs"}
VLLM_CHAT = {
    "model",
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "return_token_strs",
}
LLAMA_TOKENIZE = {"content", "add_special", "parse_special", "with_pieces", "model"}
LLAMA_APPLY_TEMPLATE = {
    "model",
    "messages",
    "tools",
    "chat_template_kwargs",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
}


def refuse_unknown(body: Mapping[str, Any], known: set[str], where: str) -> None:
    for key in body:
        if key not in known:
            raise RequestValidationError(
                f"{where} does not take {key!r}",
                path=f"$.{key}",
                hint=f"the fields it takes: {', '.join(sorted(known))} (nothing unknown is ignored silently)",
            )


def flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise RequestValidationError(f"{key} is a boolean", path=f"$.{key}")
    return value


def text_field(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise RequestValidationError(f"{key} is a string", path=f"$.{key}", hint="send the text to tokenize")
    return value


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """`chat_template_kwargs`, refused when it names the template or a name the template stage binds itself."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise RequestValidationError("chat_template_kwargs is an object", path="$.chat_template_kwargs")
    for key in kwargs:
        if not key.isidentifier():
            raise RequestValidationError(
                f"{key!r} is not a template variable name",
                path=f"$.chat_template_kwargs.{key}",
                hint="use an identifier: letters, digits and underscores, not starting with a digit",
            )
        if key in SMUGGLING_KEYS:
            raise RequestValidationError(
                f"chat_template_kwargs may not set {key!r}",
                path=f"$.chat_template_kwargs.{key}",
                hint="a template (or a name the template stage binds) is never taken from a request",
            )
    return kwargs


def chat_options(
    sm: ServedModel,
    body: Mapping[str, Any],
    *,
    allow_named: bool,
    where: str,
    extra_kwargs: Mapping[str, Any] | None = None,
) -> RenderOptions:
    """The RenderOptions of a chat-form body: generation prompt, continuation, kwargs (with `extra_kwargs` over the
    body's own) and the (named) template."""
    agp = flag(body, "add_generation_prompt", True)
    cont = flag(body, "continue_final_message", False)
    if agp and cont and "add_generation_prompt" in body:
        raise RequestValidationError(
            "add_generation_prompt and continue_final_message cannot both be true",
            path="$.continue_final_message",
            hint="continue the final message, or open a new assistant turn, not both",
        )
    return sm.options(
        add_generation_prompt=agp and not cont,
        continue_final_message=cont,
        kwargs={**(template_kwargs(body) or {}), **(extra_kwargs or {})} or None,
        template_name=sm.named_template(body.get("chat_template"), allow_named=allow_named, where=where),
    )


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": body.get("messages")}
    if body.get("tools") is not None:
        request["tools"] = body["tools"]
    return request


def vllm_tokenize(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool) -> dict[str, Any]:
    """vLLM's POST /tokenize: the completion form (`prompt`) or the chat form (`messages`). In the chat form
    `add_special_tokens: true` adds the tokenizer's own special tokens around the template's ids, as vLLM encodes
    the rendered text with them; `double_bos` then says whether that gave a second BOS (a template that writes its
    BOS itself)."""
    extra: dict[str, Any] = {}
    if "messages" in body:
        refuse_unknown(body, VLLM_CHAT, "/tokenize (chat form)")
        options = chat_options(sm, body, allow_named=allow_named, where="/tokenize")
        ids = sm.model.encode(chat_request(body), options)["input_ids"][0].tolist()
        if flag(body, "add_special_tokens", False):
            prefix, suffix = sm.special_affixes
            extra["double_bos"] = bool(prefix) and ids[: len(prefix)] == list(prefix)
            ids = [*prefix, *ids, *suffix]
    else:
        refuse_unknown(body, VLLM_COMPLETION, "/tokenize (completion form)")
        prompt = text_field(body, "prompt")
        ids = sm.model.tokenizer.encode(prompt, add_special_tokens=flag(body, "add_special_tokens", True))
    out: dict[str, Any] = {"count": len(ids), "max_model_len": sm.max_model_len, "tokens": ids}
    out["token_strs"] = (
        [sm.model.tokenizer.id_to_token(i) for i in ids] if flag(body, "return_token_strs", False) else None
    )
    return {**out, **extra}


def check_ids(sm: ServedModel, tokens: Any, key: str) -> list[int]:
    n = sm.model.tokenizer.vocab_size
    if not isinstance(tokens, list):
        raise RequestValidationError(f"{key} is a list of token ids", path=f"$.{key}")
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n:
            raise RequestValidationError(
                f"not a token id of {sm.model.id} (0..{n - 1})", path=f"$.{key}[{i}]", hint="send ids /tokenize gave"
            )
    return tokens


def tokenizer_info(sm: ServedModel) -> dict[str, Any]:
    """vLLM's GET /tokenizer_info, with the fields ctxlock knows exactly (vLLM answers the tokenizer's whole config):
    the tokenizer class, what `add_special_tokens` adds, the served chat template, `model_max_length` (the configured
    max_model_len) and the added tokens by id."""
    tok = sm.model.tokenizer
    described = tok.describe()
    prefix, suffix = sm.special_affixes
    out: dict[str, Any] = {
        "tokenizer_class": described.get("tokenizer_class") or described.get("format") or type(tok).__name__,
        "add_bos_token": bool(prefix),
        "add_eos_token": bool(suffix),
    }
    # The named tokens as the tokenizer's files state them (vLLM answers its tokenizer's config: eos_token even
    # when encoding adds none); what encoding adds is `add_bos_token` / `add_eos_token` above.
    named = sm.model.special_tokens
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if isinstance(named.get(key), str):
            out[key] = named[key]
    template = sm.template
    if template is None and sm.model.templates is not None:
        template = sm.model.templates.select(None)
    if template is not None:
        out["chat_template"] = template.source
    if sm.max_model_len is not None:
        out["model_max_length"] = sm.max_model_len
    out["added_tokens_decoder"] = {str(t.id): {"content": t.content, "special": t.special} for t in tok.added_tokens}
    return out


def detokenize(sm: ServedModel, body: Mapping[str, Any], *, named: bool) -> dict[str, Any]:
    """POST /detokenize: vLLM answers `{prompt}`, llama.cpp `{content}`, for the same `{tokens}` body. A body that
    names a served model is a vLLM client's (`{prompt}`, exactly vLLM's answer); any other (no `model`, or one the
    fallback model stood in for: llama.cpp ignores the name) gets both fields, the same text, so either client
    reads its own."""
    refuse_unknown(body, {"model", "tokens"}, "/detokenize")
    text = sm.model.tokenizer.decode(check_ids(sm, body.get("tokens"), "tokens"))
    return {"prompt": text} if named else {"content": text, "prompt": text}


def control_text_warning(sm: ServedModel, text: str) -> list[str]:
    """The `warnings` of the llama.cpp `content` form: control-token text it kept as text (parse_special false)."""
    tok = sm.model.tokenizer
    matches = tok.split_controls(text)
    if matches is None:
        matches = tok.encode_matched(text)[1]
    if not matches:
        return []
    return [
        f"content holds {len(matches)} control-token string(s), tokenized as text (parse_special is false unless "
        "sent); llama.cpp's default parses them: send parse_special: true if this is a rendered prompt you trust"
    ]


def llama_tokenize(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's POST /tokenize: `{content, add_special, parse_special, with_pieces}` -> `{tokens}`; with
    `with_pieces` each token is `{id, piece}`, the piece a string, or its bytes when they are not valid UTF-8.
    `parse_special: true` parses control-token text in `content` into control ids, as llama.cpp does; without it the
    text stays text (llama.cpp's default is true) and `warnings` says so when there was any."""
    refuse_unknown(body, LLAMA_TOKENIZE, "/tokenize (llama.cpp form)")
    tok = sm.model.tokenizer
    content = text_field(body, "content")
    parse = flag(body, "parse_special", False)
    ids = tok.encode(content, parse_special=parse, add_special_tokens=flag(body, "add_special", False))
    warnings = [] if parse else control_text_warning(sm, content)
    out: dict[str, Any] = {"tokens": ids}
    if flag(body, "with_pieces", False):
        pieces = tok.token_bytes().pieces
        listed = []
        for i in ids:
            raw = pieces[i]
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            listed.append({"id": i, "piece": piece})
        out["tokens"] = listed
    if warnings:
        out["warnings"] = warnings
    return out


def apply_template(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool) -> dict[str, Any]:
    """llama.cpp's POST /apply-template: `{messages}` -> `{prompt}`, the rendered text. As llama.cpp does
    (common/chat.cpp, common_chat_template_direct_apply), a leading BOS text is cut when the tokenizer adds a BOS
    itself, and a trailing EOS text when it adds an EOS, so that tokenizing the prompt with `add_special: true`
    gives one BOS, not two."""
    refuse_unknown(body, LLAMA_APPLY_TEMPLATE, "/apply-template")
    options = chat_options(sm, body, allow_named=allow_named, where="/apply-template")
    text = sm.model.render(chat_request(body), options).text
    tok = sm.model.tokenizer
    prefix, suffix = sm.special_affixes
    if len(prefix) == 1 and (bos := tok.id_to_token(prefix[0])) and text.startswith(bos):
        text = text[len(bos) :]
    if len(suffix) == 1 and (eos := tok.id_to_token(suffix[0])) and text.endswith(eos):
        text = text[: -len(eos)]
    return {"prompt": text}


def anthropic_count(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's POST /v1/messages/count_tokens -> `{"input_tokens": N}`, exact for the served model. The fields
    the template renders (`messages`, `system`, `tools`) are counted; the Messages API's generation settings a
    client may send are accepted and named in `ignored`, as are blocks that are not model input (redacted_thinking);
    request parts the template leaves out are named in `unseen`; any other field is refused."""
    known = {"model", "messages", "system", "tools", "chat_template_kwargs", *ANTHROPIC_SETTINGS}
    refuse_unknown(body, known, "/v1/messages/count_tokens")
    request = {k: v for k, v in body.items() if k != "model"}
    counts = sm.model.count(request, **sm.option_kwargs(), dialect="anthropic")
    out = count_format(counts, "anthropic")
    ignored = [dict(b) for b in ignored_blocks(request)]  # accepted blocks that are not model input
    ignored += [{"path": k, "type": "setting", "reason": _ANTHROPIC_SETTING} for k in body if k in ANTHROPIC_SETTINGS]
    if ignored:
        out["ignored"] = ignored
    return with_unseen(out, counts.unseen)


# The Messages API's settings (messages.create and messages.count_tokens) that a served model's template is not
# given: clients such as Claude Code send them to count_tokens too, and vLLM and llama.cpp accept them there.
ANTHROPIC_SETTINGS = frozenset(
    {
        "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream", "metadata", "service_tier",
        "tool_choice", "thinking", "cache_control", "output_config", "output_format", "speed", "container",
        "inference_geo", "user_profile_id", "workspace_id",
    }
)  # fmt: skip
_ANTHROPIC_SETTING = "a generation or account setting: the served model's template is not given it"


def with_unseen(out: dict[str, Any], unseen: tuple[str, ...]) -> dict[str, Any]:
    """`out` with `unseen`, the request parts the template left out of the input (when there are any): a client
    counting what it sent learns what the model will not see."""
    if unseen:
        out["unseen"] = list(unseen)
    return out


def openai_input_tokens(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's POST /v1/responses/input_tokens -> `{"object": "response.input_tokens", "input_tokens": N}`: the
    body's items become chat messages (`request.openai.responses_request`, docs/anthropic-and-responses.md)."""
    known = {"model", "input", "instructions", "tools", "tool_choice", *_RESPONSES_IGNORED}
    refuse_unknown(body, known, "/v1/responses/input_tokens")
    request = {k: v for k, v in body.items() if k not in _RESPONSES_IGNORED}
    out = count_format(sm.model.count(responses_request(request), **sm.option_kwargs()), "openai")
    ignored = [
        _ignored_setting(body, key, kinds) for key, kinds in _RESPONSES_IGNORED.items() if body.get(key) is not None
    ]
    if ignored:
        out["ignored"] = ignored
    return out


# Settings the OpenAI SDK's `responses.input_tokens.count` may send that do not change the input a served model's
# template renders (vLLM's and llama.cpp's Responses endpoints use them for generation only). Each is accepted, its
# type checked, and named in the answer's "ignored" list: (allowed JSON types, why it does not change the count).
_RESPONSES_IGNORED: dict[str, tuple[tuple[type, ...], str]] = {
    "parallel_tool_calls": ((bool,), "a generation setting: the rendered input does not depend on it"),
    "reasoning": (
        (dict,),
        "reasoning effort is a generation setting of OpenAI's models: the served template is not given it",
    ),
    "text": ((dict,), "the output format constrains decoding; it is not rendered into the input"),
    "truncation": ((str,), "ctxlock counts the whole input; POST /v1/fit shows what a context budget keeps"),
}


def _ignored_setting(body: Mapping[str, Any], key: str, spec: tuple[tuple[type, ...], str]) -> dict[str, str]:
    kinds, reason = spec
    value = body[key]
    if not isinstance(value, kinds) or (key == "truncation" and value not in ("auto", "disabled")):
        want = {"parallel_tool_calls": "true or false", "reasoning": "an object", "text": "an object"}.get(
            key, '"auto" or "disabled"'
        )
        raise RequestValidationError(f"{key} must be {want}", path=f"$.{key}", hint="as OpenAI's Responses API")
    return {"path": key, "type": "setting", "reason": reason}
