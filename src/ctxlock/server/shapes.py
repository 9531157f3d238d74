"""The anchors' endpoints, field for field: vLLM's /tokenize and /detokenize, llama.cpp's /tokenize (`content`,
`with_pieces`) and /apply-template, Anthropic's count_tokens and OpenAI's responses/input_tokens. Each is a function
of a served model and the parsed JSON body, run on a pool worker; the ids are ctxlock's exact ones.

Where ctxlock departs from an anchor it refuses with 400 rather than doing something else silently: special-token
text in a prompt or message is always text (vLLM's and llama.cpp's parse it by default), a request-supplied
`chat_template` is refused unless the config allows named templates (and then only a configured name), and
`chat_template_kwargs` cannot carry a template or shadow a template global (CVE-2025-61620)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..accounting import count_format
from ..errors import RequestValidationError
from ..options import RenderOptions
from ..request import RESERVED_TEMPLATE_KWARGS
from ..request.anthropic import ignored_blocks
from ..request.openai import responses_request
from .models import ServedModel

# Keys that would replace the template, or its inputs, if a request could set them through chat_template_kwargs.
SMUGGLING_KEYS = RESERVED_TEMPLATE_KWARGS | {"chat_template", "template", "tokenizer", "tokenize", "return_dict"}

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
        if key in SMUGGLING_KEYS:
            raise RequestValidationError(
                f"chat_template_kwargs may not set {key!r}",
                path=f"$.chat_template_kwargs.{key}",
                hint="a template (or a name the template stage binds) is never taken from a request",
            )
    return kwargs


def chat_options(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool, where: str) -> RenderOptions:
    """The RenderOptions of a chat-form body: generation prompt, continuation, kwargs and the (named) template."""
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
        kwargs=template_kwargs(body),
        template_name=sm.named_template(body.get("chat_template"), allow_named=allow_named, where=where),
    )


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": body.get("messages")}
    if body.get("tools") is not None:
        request["tools"] = body["tools"]
    return request


def vllm_tokenize(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool) -> dict[str, Any]:
    """vLLM's POST /tokenize: the completion form (`prompt`) or the chat form (`messages`)."""
    if "messages" in body:
        refuse_unknown(body, VLLM_CHAT, "/tokenize (chat form)")
        if flag(body, "add_special_tokens", False):
            raise RequestValidationError(
                "add_special_tokens is not supported in the chat form",
                path="$.add_special_tokens",
                hint="the chat template writes the model's BOS itself; adding it again gives a second BOS",
            )
        options = chat_options(sm, body, allow_named=allow_named, where="/tokenize")
        ids = sm.model.encode(chat_request(body), options)["input_ids"][0].tolist()
    else:
        refuse_unknown(body, VLLM_COMPLETION, "/tokenize (completion form)")
        prompt = text_field(body, "prompt")
        ids = sm.model.tokenizer.encode(prompt, add_special_tokens=flag(body, "add_special_tokens", True))
    out: dict[str, Any] = {"count": len(ids), "max_model_len": sm.max_model_len, "tokens": ids}
    out["token_strs"] = (
        [sm.model.tokenizer.id_to_token(i) for i in ids] if flag(body, "return_token_strs", False) else None
    )
    return out


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


def vllm_detokenize(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    refuse_unknown(body, {"model", "tokens"}, "/detokenize")
    return {"prompt": sm.model.tokenizer.decode(check_ids(sm, body.get("tokens"), "tokens"))}


def llama_tokenize(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's POST /tokenize: `{content, add_special, parse_special, with_pieces}` -> `{tokens}`; with
    `with_pieces` each token is `{id, piece}`, the piece a string, or its bytes when they are not valid UTF-8."""
    refuse_unknown(body, LLAMA_TOKENIZE, "/tokenize (llama.cpp form)")
    if flag(body, "parse_special", False):
        raise RequestValidationError(
            "parse_special is not supported: special-token text in content is always text",
            path="$.parse_special",
            hint="drop it (llama.cpp's default parses it, the injection of llama.cpp#24382)",
        )
    tok = sm.model.tokenizer
    ids = tok.encode(text_field(body, "content"), add_special_tokens=flag(body, "add_special", False))
    if not flag(body, "with_pieces", False):
        return {"tokens": ids}
    pieces = tok.token_bytes().pieces
    out = []
    for i in ids:
        raw = pieces[i]
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": i, "piece": piece})
    return {"tokens": out}


def apply_template(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool) -> dict[str, Any]:
    """llama.cpp's POST /apply-template: `{messages}` -> `{prompt}`, the rendered text."""
    refuse_unknown(body, {"model", "messages", "tools", "chat_template_kwargs", "chat_template"}, "/apply-template")
    options = chat_options(sm, body, allow_named=allow_named, where="/apply-template")
    return {"prompt": sm.model.render(chat_request(body), options).text}


def anthropic_count(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's POST /v1/messages/count_tokens -> `{"input_tokens": N}`, exact for the served model."""
    request = {k: v for k, v in body.items() if k != "model"}
    counts = sm.model.count(request, **sm.option_kwargs(), dialect="anthropic")
    out = count_format(counts, "anthropic")
    ignored = ignored_blocks(request)  # accepted blocks that are not model input (redacted_thinking): named here
    if ignored:
        out["ignored"] = [dict(b) for b in ignored]
    return out


def openai_input_tokens(sm: ServedModel, body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's POST /v1/responses/input_tokens -> `{"object": "response.input_tokens", "input_tokens": N}`: the
    body's items become chat messages (`request.openai.responses_request`, docs/anthropic-and-responses.md)."""
    refuse_unknown(body, {"model", "input", "instructions", "tools", "tool_choice"}, "/v1/responses/input_tokens")
    return count_format(sm.model.count(responses_request(dict(body)), **sm.option_kwargs()), "openai")
