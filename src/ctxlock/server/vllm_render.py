"""vLLM's render routes: `POST /v1/chat/completions/render` and `POST /v1/completions/render`, the token ids a
request becomes, as vLLM hands them to its engine, without generating (vLLM added them in
https://github.com/vllm-project/vllm/pull/32473; vllm/entrypoints/serve/render/). The answer is vLLM's
`GenerateRequest` (since https://github.com/vllm-project/vllm/pull/35684; vllm/entrypoints/serve/disagg/protocol.py):
`{request_id, token_ids, features, sampling_params, model, stream, stream_options, cache_salt, priority,
kv_transfer_params}`, one for a chat request, a list of them (one per prompt) for a completion request. The ids are
ctxlock's exact ones: the chat form renders as `/tokenize`'s chat form does.

What the answer holds besides the ids, as vLLM fills it: `request_id` is `chatcmpl-` or `cmpl-` and a random hex;
`model` is the request's own (null when it named none); `features` is null (text only); `sampling_params` holds the
sampling settings the request sent, under vLLM's `SamplingParams` names (`max_completion_tokens` becomes
`max_tokens`, the chat form's `logprobs: true` becomes `logprobs: top_logprobs`); vLLM's defaults for the others
come from the model's generation config, which ctxlock does not read, so they are absent, not guessed. Settings that
do not change the ids (`tool_choice`, `response_format`, ...) are accepted and named in the answer's `ignored`; any
other unknown field is refused (400). With `max_model_len` configured, a prompt longer than `max_model_len` minus
the requested output tokens is refused as vLLM refuses it (400, `param` "input_tokens").

`reasoning_effort` is rendered as vLLM renders it (`ChatCompletionRequest.build_chat_params`): the template variable
`reasoning_effort`, and `enable_thinking` (false for "none", else true) unless `chat_template_kwargs` sets it.

Errors on these routes are in vLLM's shape, `{"error": {message, type, param, code}}` (edge.py, `vllm_error`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from ctxlock.errors import RequestValidationError
from ctxlock.request import json_type_name
from ctxlock.server.models import ServedModel
from ctxlock.server.shapes import chat_options, check_ids, flag, refuse_unknown

# The request fields that make the ids.
CHAT_RENDERED = frozenset(
    {
        "model", "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
        "add_special_tokens", "chat_template", "chat_template_kwargs", "reasoning_effort",
    }
)  # fmt: skip
COMPLETION_RENDERED = frozenset({"model", "prompt", "add_special_tokens"})
# The GenerateRequest's own fields a request carries over (besides `model`).
CARRIED = frozenset({"stream", "stream_options", "cache_salt", "priority"})
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# vLLM's CompletionRequest.max_tokens default (an OpenAI completions request asks for 16 tokens unless it says).
COMPLETION_MAX_TOKENS = 16

# Sampling settings: the request's name -> (the SamplingParams name, its JSON kind). `logprobs` and `top_logprobs`
# are read apart (their meaning differs between the chat and the completion form).
SAMPLING: dict[str, tuple[str, str]] = {
    "n": ("n", "count"),
    "temperature": ("temperature", "number"),
    "top_p": ("top_p", "number"),
    "top_k": ("top_k", "int"),
    "min_p": ("min_p", "number"),
    "presence_penalty": ("presence_penalty", "number"),
    "frequency_penalty": ("frequency_penalty", "number"),
    "repetition_penalty": ("repetition_penalty", "number"),
    "seed": ("seed", "int"),
    "stop": ("stop", "stop"),
    "stop_token_ids": ("stop_token_ids", "ints"),
    "bad_words": ("bad_words", "strings"),
    "ignore_eos": ("ignore_eos", "bool"),
    "max_tokens": ("max_tokens", "count"),
    "max_completion_tokens": ("max_tokens", "count"),
    "min_tokens": ("min_tokens", "count"),
    "skip_special_tokens": ("skip_special_tokens", "bool"),
    "spaces_between_special_tokens": ("spaces_between_special_tokens", "bool"),
    "include_stop_str_in_output": ("include_stop_str_in_output", "bool"),
    "logit_bias": ("logit_bias", "object"),
    "allowed_token_ids": ("allowed_token_ids", "ints"),
    "prompt_logprobs": ("prompt_logprobs", "int"),
}
_NOT_IDS = "accepted as vLLM accepts it; it does not change the prompt's token ids"
# Accepted and named in the answer's `ignored`: settings of generation (or of the request's bookkeeping) that the
# render does not use. `use_beam_search: true` is refused, as vLLM's render refuses it.
IGNORED: dict[str, str] = {
    "tool_choice": "constrains generation; the template is given the tools either way (vLLM drops them for 'none' "
    "only when started with --exclude-tools-when-tool-choice-none)",
    "parallel_tool_calls": _NOT_IDS,
    "response_format": "constrains decoding; it is not rendered into the prompt",
    "structured_outputs": "constrains decoding; it is not rendered into the prompt",
    "user": _NOT_IDS,
    "metadata": _NOT_IDS,
    "store": _NOT_IDS,
    "service_tier": _NOT_IDS,
    "include_reasoning": _NOT_IDS,
    "request_id": "the answer's request_id is the route's own, as vLLM's render makes one",
    "session_id": _NOT_IDS,
    "echo": _NOT_IDS,
    "best_of": _NOT_IDS,
    "return_token_ids": _NOT_IDS,
    "return_tokens_as_token_ids": _NOT_IDS,
    "length_penalty": _NOT_IDS,
    "use_beam_search": _NOT_IDS,
    "thinking_token_budget": _NOT_IDS,
}


def _bad(key: str, want: str, value: Any) -> RequestValidationError:
    return RequestValidationError(
        f"{key} must be {want}, not {json_type_name(value)}", path=f"$.{key}", hint="as vLLM's request types it"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(key: str, kind: str, value: Any) -> Any:
    """`value` of a sampling setting, checked against its JSON kind (null stands for not set)."""
    ok = {
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "int": _is_int,
        "count": lambda v: _is_int(v) and v >= 0,
        "bool": lambda v: isinstance(v, bool),
        "ints": lambda v: isinstance(v, list) and all(_is_int(i) for i in v),
        "strings": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
        "stop": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, str) for i in v)),
        "object": lambda v: isinstance(v, dict),
    }[kind]
    if not ok(value):
        want = {
            "number": "a number",
            "int": "an integer",
            "count": "a non-negative integer",
            "bool": "a boolean",
            "ints": "a list of integers",
            "strings": "a list of strings",
            "stop": "a string or a list of strings",
            "object": "an object",
        }[kind]
        raise _bad(key, want, value)
    return value


def sampling_params(body: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    """The request's sampling settings under vLLM's SamplingParams names (only those sent, null ones left out)."""
    out: dict[str, Any] = {}
    for key, (name, kind) in SAMPLING.items():
        if body.get(key) is not None and not (key == "max_tokens" and body.get("max_completion_tokens") is not None):
            out[name] = _checked(key, kind, body[key])
    top = body.get("top_logprobs")
    if top is not None:
        _checked("top_logprobs", "count", top)
    logprobs = body.get("logprobs")
    if chat and logprobs is not None and _checked("logprobs", "bool", logprobs):
        out["logprobs"] = top if top is not None else 0
    elif not chat and logprobs is not None:
        out["logprobs"] = _checked("logprobs", "count", logprobs)
    return out


def _ignored(body: Mapping[str, Any]) -> list[dict[str, str]]:
    if body.get("use_beam_search") is True:
        raise RequestValidationError(
            "Beam search is not supported by the render endpoint",
            path="$.use_beam_search",
            hint="as vLLM's render route answers it: send use_beam_search false, or leave it out",
        )
    return [{"path": k, "type": "setting", "reason": r} for k, r in IGNORED.items() if body.get(k) is not None]


def _carried(body: Mapping[str, Any]) -> dict[str, Any]:
    """The GenerateRequest fields a request carries over: stream (and its options, only when streaming), the cache
    salt and the priority."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "a boolean", stream)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "an object", options)
    salt = body.get("cache_salt")
    if salt is not None and not (isinstance(salt, str) and 1 <= len(salt) <= 1024):
        raise RequestValidationError(
            "cache_salt must be a string of 1 to 1024 characters", path="$.cache_salt", hint="as vLLM's request says"
        )
    priority = body.get("priority", 0)
    if not _is_int(priority):
        raise _bad("priority", "an integer", priority)
    return {
        "stream": bool(stream),
        "stream_options": options if stream else None,
        "cache_salt": salt,
        "priority": priority,
        "kv_transfer_params": None,
    }


def _check_length(sm: ServedModel, n: int, sampling: Mapping[str, Any], default_output: int, where: str) -> None:
    """vLLM's length checks (vllm/renderers/params.py, TokenizeParams): the requested output tokens fit in
    `max_model_len`, and the prompt fits in what they leave."""
    limit = sm.max_model_len
    if limit is None:
        return
    output = sampling.get("max_tokens", default_output)
    if output > limit:
        raise RequestValidationError(
            f"max_tokens={output} cannot be greater than max_model_len={limit}",
            path="$.max_tokens",
            hint="request fewer output tokens",
        )
    if n > limit - output:
        raise RequestValidationError(
            f"You passed {n} input tokens and requested {output} output tokens. However, the model's context "
            f"length is only {limit} tokens, resulting in a maximum input length of {limit - output} tokens.",
            path="input_tokens",
            hint=f"shorten {where} or request fewer output tokens (the model's max_model_len is configured)",
        )


def _generate_request(prefix: str, ids: list[int], body: Mapping[str, Any], sampling: dict[str, Any]) -> dict:
    if not ids:
        raise RequestValidationError("No token_ids rendered", path="$", hint="the request renders to no tokens")
    return {
        "request_id": f"{prefix}-{uuid.uuid4().hex}",
        "token_ids": ids,
        "features": None,
        "sampling_params": sampling,
        "model": body.get("model"),
        **_carried(body),
    }


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's extra template variables from `reasoning_effort` (validated; the kwargs themselves are checked by
    `chat_options`)."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise RequestValidationError(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}",
            path="$.reasoning_effort",
            hint="as vLLM's request says",
        )
    kwargs = body.get("chat_template_kwargs")
    extra: dict[str, Any] = {"reasoning_effort": effort}
    if not (isinstance(kwargs, dict) and "enable_thinking" in kwargs):
        extra["enable_thinking"] = effort != "none"
    return extra


def chat_render(sm: ServedModel, body: Mapping[str, Any], *, allow_named: bool) -> dict[str, Any]:
    """POST /v1/chat/completions/render: one GenerateRequest, its `token_ids` the request's exact ids (the
    template's, with the tokenizer's own special tokens around them when `add_special_tokens` is true)."""
    refuse_unknown(body, {*CHAT_RENDERED, *CARRIED, *SAMPLING, "logprobs", "top_logprobs", *IGNORED}, "this route")
    if body.get("messages") is None:
        raise RequestValidationError("messages is required", path="$.messages", hint="send the conversation")
    ignored = _ignored(body)
    sampling = sampling_params(body, chat=True)
    options = chat_options(
        sm, body, allow_named=allow_named, where="/v1/chat/completions/render", extra_kwargs=_template_kwargs(body)
    )
    request = {k: body[k] for k in ("messages", "tools", "documents") if body.get(k) is not None}
    ids = sm.model.encode(request, options)["input_ids"][0].tolist()
    if flag(body, "add_special_tokens", False):
        prefix, suffix = sm.special_affixes
        ids = [*prefix, *ids, *suffix]
    _check_length(sm, len(ids), sampling, 0, "the conversation")
    out = _generate_request("chatcmpl", ids, body, sampling)
    if ignored:
        out["ignored"] = ignored
    return out


def _prompts(sm: ServedModel, value: Any, add_special: bool) -> list[list[int]]:
    """A completion request's `prompt` as id lists: a string, a list of strings, a list of ids or a list of lists
    of ids (vLLM's forms). Text is encoded with special-token text kept as text (docs/serve-compat.md)."""
    tok = sm.model.tokenizer
    if isinstance(value, str):
        return [tok.encode(value, add_special_tokens=add_special)]
    if isinstance(value, list) and value:
        if all(isinstance(p, str) for p in value):
            return [tok.encode(p, add_special_tokens=add_special) for p in value]
        if all(_is_int(t) for t in value):
            return [check_ids(sm, value, "prompt")]
        if all(isinstance(p, list) for p in value):
            return [check_ids(sm, p, f"prompt[{i}]") for i, p in enumerate(value)]
    raise RequestValidationError(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists",
        path="$.prompt",
        hint="as vLLM's completion request takes it (not empty)",
    )


def completion_render(sm: ServedModel, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """POST /v1/completions/render: one GenerateRequest per prompt. Text prompts are encoded with the tokenizer's
    special tokens unless `add_special_tokens` is false (vLLM's default for completions); id prompts are taken as
    sent (checked against the vocabulary)."""
    known = {*COMPLETION_RENDERED, *CARRIED, *SAMPLING, "logprobs", *IGNORED} - {"max_completion_tokens"}
    refuse_unknown(body, known, "this route")
    ignored = _ignored(body)
    sampling = sampling_params(body, chat=False)
    if "prompt" not in body:
        raise RequestValidationError("prompt is required", path="$.prompt", hint="send the text to render")
    out = []
    default_output = 0 if "max_tokens" in body else COMPLETION_MAX_TOKENS  # an explicit null asks for none
    for i, ids in enumerate(_prompts(sm, body["prompt"], flag(body, "add_special_tokens", True))):
        _check_length(sm, len(ids), sampling, default_output, f"prompt {i}")
        item = _generate_request("cmpl", list(ids), body, sampling)
        if ignored:
            item["ignored"] = ignored
        out.append(item)
    return out
