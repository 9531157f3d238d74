"""`GET /openapi.json`: the server's OpenAPI 3.1 document, written out route by route: each request body's JSON
Schema (the anchors' fields, ctxlock's own), the query and path parameters, each answer's schema and the error body
every route may answer with. `tests/server/test_serve_schema.py` runs schemathesis against it on the real server.

The schemas describe what the server accepts at the HTTP level; a body that fits them may still be refused by the
pipeline (an unknown role, a template the model lacks): such a refusal is a documented 4xx with the error body."""

from __future__ import annotations

from typing import Any

from ctxlock.server.shapes import ANTHROPIC_SETTINGS
from ctxlock.server.vllm_render import IGNORED, REASONING_EFFORTS, SAMPLING

# The status of each error type (edge.STATUS): every route may answer these with the error body.
ERROR_STATUSES = {
    "400": "The request is malformed or not allowed (bad JSON, an unknown field, a template in the request).",
    "401": "A bearer token is configured and the request has none, or a wrong one.",
    "404": "No such record, template, model name or store.",
    "405": "The route does not take this method.",
    "408": "The headers or the body came too slowly (limits.header_timeout_seconds, limits.min_body_rate).",
    "413": "The body is over limits.max_body_bytes (refused on Content-Length before it is read).",
    "422": "Well-formed, but the pipeline could not process it (template, tokenizer, budget).",
    "429": "Over limits.requests_per_second for this token: retry after Retry-After seconds.",
    "431": "The request line and headers are over limits.max_header_bytes or limits.max_header_count.",
    "503": "The worker pool and its queue are full, or a connection cap is reached (Retry-After), or the render "
    "deadline passed.",
}

ERROR = {
    "type": "object",
    "required": ["type", "message", "path", "hint"],
    "properties": {
        "type": {"type": "string"},
        "message": {"type": "string"},
        "path": {"type": ["string", "null"]},
        "hint": {"type": ["string", "null"]},
    },
}

# vLLM's error shape (its ErrorResponse), on vLLM's render routes; `hint` is ctxlock's.
VLLM_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
                "hint": {"type": ["string", "null"]},
            },
        }
    },
}
# Refused on the wire before the route is known (connection.py): ctxlock's shape on every route.
WIRE_STATUSES = frozenset({"408", "431"})

CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]}
MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {"role": {"type": "string"}, "content": CONTENT},
    "additionalProperties": True,
}
MESSAGES = {"type": "array", "items": MESSAGE}
TOOLS = {"type": "array", "items": {"type": "object"}}
MODEL = {
    "type": "string",
    "description": "A configured model name (GET /v1/models); the default when absent. With server.fallback_model "
    "set, any other name gets that model and the X-Ctxlock-Model-Fallback header.",
}
IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
ANY_OBJECT = {"type": "object"}


def _obj(required: list[str], props: dict[str, Any], *, extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props, "additionalProperties": extra}


VLLM_COMPLETION = _obj(
    ["prompt"],
    {
        "model": MODEL,
        "prompt": {"type": "string"},
        "add_special_tokens": {"type": "boolean"},
        "return_token_strs": {"type": "boolean"},
    },
)
VLLM_CHAT = _obj(
    ["messages"],
    {
        "model": MODEL,
        "messages": MESSAGES,
        "add_generation_prompt": {"type": "boolean"},
        "continue_final_message": {"type": "boolean"},
        "add_special_tokens": {"type": "boolean"},
        "tools": TOOLS,
        "chat_template": {"type": "string", "description": "Refused (400) unless the config allows named templates."},
        "chat_template_kwargs": ANY_OBJECT,
        "return_token_strs": {"type": "boolean"},
    },
)
LLAMA_TOKENIZE = _obj(
    ["content"],
    {
        "model": MODEL,
        "content": {"type": "string"},
        "add_special": {"type": "boolean"},
        "parse_special": {
            "type": "boolean",
            "description": "true: control-token text in content becomes control ids (llama.cpp's meaning). Default "
            "false (llama.cpp's is true): the text stays text, and `warnings` says so when there was any.",
        },
        "with_pieces": {"type": "boolean"},
    },
)
VLLM_TOKENIZE_OUT = _obj(
    ["count", "max_model_len", "tokens", "token_strs"],
    {
        "count": {"type": "integer"},
        "max_model_len": {"type": ["integer", "null"]},
        "tokens": IDS,
        "token_strs": {"type": ["array", "null"], "items": {"type": "string"}},
        "double_bos": {
            "type": "boolean",
            "description": "Chat form with add_special_tokens only: whether the added BOS made a second one.",
        },
    },
)
PIECE = _obj(
    ["id", "piece"],
    {
        "id": {"type": "integer"},
        "piece": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
    },
)
LLAMA_TOKENIZE_OUT = _obj(
    ["tokens"],
    {
        "tokens": {"anyOf": [IDS, {"type": "array", "items": PIECE}]},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
)
PROMPT_OUT = _obj(["prompt"], {"prompt": {"type": "string"}})
DETOKENIZE_OUT = _obj(["prompt"], {"prompt": {"type": "string"}, "content": {"type": "string"}})
APPLY_TEMPLATE_IN = _obj(
    ["messages"],
    {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": {"anyOf": [TOOLS, {"type": "null"}]},
        "chat_template": {"type": "string"},
        "chat_template_kwargs": ANY_OBJECT,
        "add_generation_prompt": {"type": "boolean"},
        "continue_final_message": {"type": "boolean"},
    },
)
TOKENIZER_INFO_OUT = _obj(
    ["tokenizer_class", "add_bos_token", "add_eos_token", "added_tokens_decoder"],
    {
        "tokenizer_class": {"type": "string"},
        "add_bos_token": {"type": "boolean"},
        "add_eos_token": {"type": "boolean"},
        "bos_token": {"type": "string"},
        "eos_token": {"type": "string"},
        "pad_token": {"type": "string"},
        "unk_token": {"type": "string"},
        "chat_template": {"type": "string"},
        "model_max_length": {"type": "integer"},
        "added_tokens_decoder": {
            "type": "object",
            "additionalProperties": _obj(
                ["content", "special"], {"content": {"type": "string"}, "special": {"type": "boolean"}}
            ),
        },
    },
)
HTML = {"text/html": {"schema": {"type": "string"}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _flag(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": what,
        "schema": {"enum": ["0", "1", "true", "false"]},
    }


QUERY_MODEL = {
    "name": "model",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "A configured model name.",
}
RECORD_ID = {"type": "string", "pattern": "^[0-9a-f]{4,64}$"}


PAGE = {
    "name": "page",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,8}$"},
    "description": "The page of limits.view_page_tokens token chips (from 1; past the last is 400).",
}


def _path_id(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": RECORD_ID}


def _op(
    summary: str,
    ok: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    open_route: bool = False,
    vllm_errors: bool = False,
) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok}}
    retry = {"Retry-After": {"schema": {"type": "string", "pattern": "^[0-9]+$"}, "required": True}}
    for code, what in ERROR_STATUSES.items():
        schema = "Error"
        if vllm_errors and code == "422":  # answered as 400, as vLLM answers a template's failure
            continue
        if vllm_errors and code not in WIRE_STATUSES:
            schema = "VllmError"
        responses[code] = {"description": what, "content": _json({"$ref": f"#/components/schemas/{schema}"})}
        if code == "429":
            responses[code]["headers"] = retry
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if params:
        op["parameters"] = params
    if open_route:
        op["security"] = []
    return op


ANTHROPIC_COUNT_OUT = _obj(
    ["input_tokens"],
    {
        "input_tokens": {"type": "integer", "minimum": 0},
        "ignored": {"type": "array", "items": ANY_OBJECT},
        "unseen": {"type": "array", "items": {"type": "string"}},
        "exact": {"type": "boolean"},
        "unknown": {"type": "array"},
    },
)
ANTHROPIC_COUNT_IN = _obj(
    ["messages"],
    {
        "model": MODEL,
        "messages": MESSAGES,
        "system": CONTENT,
        "tools": TOOLS,
        "chat_template_kwargs": ANY_OBJECT,
        # The Messages API's settings: accepted, named in the answer's `ignored`.
        **{key: {} for key in sorted(ANTHROPIC_SETTINGS)},
    },
)
RESPONSES_COUNT_OUT = _obj(
    ["object", "input_tokens"],
    {
        "object": {"const": "response.input_tokens"},
        "input_tokens": {"type": "integer", "minimum": 0},
        "ignored": {"type": "array", "items": ANY_OBJECT},
    },
)
RESPONSES_COUNT_IN = _obj(
    ["input"],
    {
        "model": MODEL,
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": ANY_OBJECT}]},
        "instructions": {"type": ["string", "null"]},
        "tools": TOOLS,
        "tool_choice": {"anyOf": [{"type": "string"}, ANY_OBJECT, {"type": "null"}]},
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "reasoning": {"anyOf": [ANY_OBJECT, {"type": "null"}]},
        "text": {"anyOf": [ANY_OBJECT, {"type": "null"}]},
        "truncation": {"enum": ["auto", "disabled", None]},
    },
)


SAMPLING_IN = {
    key: {
        "number": {"type": "number"},
        "int": {"type": "integer"},
        "count": {"type": "integer", "minimum": 0},
        "bool": {"type": "boolean"},
        "ints": {"type": "array", "items": {"type": "integer"}},
        "strings": {"type": "array", "items": {"type": "string"}},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "object": ANY_OBJECT,
    }[kind]
    for key, (_name, kind) in SAMPLING.items()
}
RENDER_COMMON = {
    "model": MODEL,
    **SAMPLING_IN,
    "stream": {"type": "boolean"},
    "stream_options": ANY_OBJECT,
    "cache_salt": {"type": "string", "minLength": 1, "maxLength": 1024},
    "priority": {"type": "integer"},
    # Accepted, named in the answer's `ignored` (use_beam_search: true is refused, as vLLM's render refuses it).
    **{key: {} for key in sorted(IGNORED)},
}
CHAT_RENDER_IN = _obj(
    ["messages"],
    {
        **RENDER_COMMON,
        "messages": MESSAGES,
        "tools": {"anyOf": [TOOLS, {"type": "null"}]},
        "documents": {"anyOf": [{"type": "array", "items": ANY_OBJECT}, {"type": "null"}]},
        "add_generation_prompt": {"type": "boolean"},
        "continue_final_message": {"type": "boolean"},
        "add_special_tokens": {"type": "boolean"},
        "chat_template": {"type": "string", "description": "Refused (400) unless the config allows named templates."},
        "chat_template_kwargs": ANY_OBJECT,
        "reasoning_effort": {"enum": [*REASONING_EFFORTS, None]},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0},
    },
)
COMPLETION_RENDER_IN = _obj(
    ["prompt"],
    {
        **{k: v for k, v in RENDER_COMMON.items() if k != "max_completion_tokens"},
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
                {"type": "array", "items": IDS, "minItems": 1},
            ]
        },
        "add_special_tokens": {"type": "boolean"},
        "logprobs": {"type": "integer", "minimum": 0},
    },
)
GENERATE_REQUEST = _obj(
    ["request_id", "token_ids", "features", "sampling_params", "model", "stream", "priority"],
    {
        "request_id": {"type": "string"},
        "token_ids": IDS,
        "features": {"type": "null"},
        "sampling_params": ANY_OBJECT,
        "model": {"type": ["string", "null"]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": ["object", "null"]},
        "cache_salt": {"type": ["string", "null"]},
        "priority": {"type": "integer"},
        "kv_transfer_params": {"type": "null"},
        "ignored": {"type": "array", "items": ANY_OBJECT},
    },
)


def _anchor_paths() -> dict[str, Any]:
    return {
        "/tokenize": {
            "post": _op(
                "vLLM's /tokenize (completion or chat form) or llama.cpp's (`content`).",
                _json({"anyOf": [VLLM_TOKENIZE_OUT, LLAMA_TOKENIZE_OUT]}),
                body=_json({"anyOf": [VLLM_COMPLETION, VLLM_CHAT, LLAMA_TOKENIZE]}),
            )
        },
        "/detokenize": {
            "post": _op(
                "vLLM's /detokenize ({prompt}, when the body names a served model) or llama.cpp's ({content}, and "
                "prompt, otherwise).",
                _json(DETOKENIZE_OUT),
                body=_json(_obj(["tokens"], {"model": MODEL, "tokens": IDS})),
            )
        },
        "/apply-template": {
            "post": _op(
                "llama.cpp's /apply-template: the rendered prompt (its BOS text cut when the tokenizer adds one).",
                _json(PROMPT_OUT),
                body=_json(APPLY_TEMPLATE_IN),
            )
        },
        "/tokenizer_info": {
            "get": _op(
                "vLLM's /tokenizer_info: the tokenizer class, what add_special_tokens adds, the chat template, "
                "model_max_length and the added tokens.",
                _json(TOKENIZER_INFO_OUT),
                params=[QUERY_MODEL],
            )
        },
        "/v1/chat/completions/render": {
            "post": _op(
                "vLLM's chat render: a GenerateRequest with the request's exact token ids (errors in vLLM's shape).",
                _json(GENERATE_REQUEST),
                body=_json(CHAT_RENDER_IN),
                vllm_errors=True,
            )
        },
        "/v1/completions/render": {
            "post": _op(
                "vLLM's completion render: a GenerateRequest per prompt (errors in vLLM's shape).",
                _json({"type": "array", "items": GENERATE_REQUEST}),
                body=_json(COMPLETION_RENDER_IN),
                vllm_errors=True,
            )
        },
        "/v1/messages/count_tokens": {
            "post": _op(
                "Anthropic's count_tokens: exact for the served model.",
                _json(ANTHROPIC_COUNT_OUT),
                body=_json(ANTHROPIC_COUNT_IN),
            )
        },
        "/v1/responses/input_tokens": {
            "post": _op(
                "OpenAI's responses/input_tokens: exact for the served model.",
                _json(RESPONSES_COUNT_OUT),
                body=_json(RESPONSES_COUNT_IN),
            )
        },
    }


PARSE_OP = _op(
    "`ctxlock parse`: a completion back into the assistant message (docs/parse.md).",
    _json(ANY_OBJECT),
    body=_json(
        _obj(
            ["output"],
            {
                "model": MODEL,
                "output": {
                    "oneOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    ]
                },
                "tools": {"type": "array", "items": ANY_OBJECT},
                "request": ANY_OBJECT,
                "tool_format": {"type": "string"},
                "reasoning": {"type": "string"},
                "finish_reason": {"type": ["string", "null"]},
                "starts": {"enum": ["reasoning", "content"]},
                "shape": {"enum": ["openai", "anthropic"]},
            },
        )
    ),
)


def _own_paths() -> dict[str, Any]:
    run_q = [QUERY_MODEL, _flag("no_generation_prompt", "No assistant header at the end.")]
    render_q = [
        *run_q,
        _flag("continue_final_message", "Continue the last message."),
        _flag("record", "Keep a record."),
    ]
    return {
        "/v1/render": {
            "post": _op("`ctxlock render --json`.", _json(ANY_OBJECT), body=_json(ANY_OBJECT), params=render_q)
        },
        "/v1/count": {
            "post": _op(
                "`ctxlock count --json`.",
                _json(ANY_OBJECT),
                body=_json(ANY_OBJECT),
                params=[*run_q, _flag("marginal", "Per-part marginal counts.")],
            )
        },
        "/v1/fit": {"post": _op("`ctxlock fit --json`.", _json(ANY_OBJECT), body=_json(ANY_OBJECT), params=run_q)},
        "/v1/cache-report": {
            "post": _op(
                "`ctxlock cache-report --json` over a JSONL session.",
                _json(ANY_OBJECT),
                body={"text/plain": {"schema": {"type": "string"}}},
                params=[
                    QUERY_MODEL,
                    {"name": "provider", "in": "query", "required": True, "schema": {"type": "string"}},
                    {"name": "ttl", "in": "query", "schema": {"type": "number", "minimum": 0}},
                    {"name": "min_prefix", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "price_model", "in": "query", "schema": {"type": "string"}},
                    _flag("fix", "Propose the cache-friendly order."),
                ],
            )
        },
        "/v1/records": {
            "get": _op(
                "The newest records.",
                _json({"type": "array", "items": ANY_OBJECT}),
                params=[
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    QUERY_MODEL,
                ],
            )
        },
        "/v1/records/{id}": {"get": _op("One record.", _json(ANY_OBJECT), params=[_path_id("id")])},
        "/v1/records/{id}/replay": {"post": _op("Replay a record.", _json(ANY_OBJECT), params=[_path_id("id")])},
        "/v1/diff": {
            "post": _op(
                "`ctxlock diff A B --json`.",
                _json(ANY_OBJECT),
                body=_json(_obj(["a", "b"], {"a": RECORD_ID, "b": RECORD_ID})),
            )
        },
        "/v1/parse": {"post": PARSE_OP},
        "/v1/models": {
            "get": _op(
                "The served models.",
                _json(
                    _obj(
                        ["object", "data"],
                        {"object": {"const": "list"}, "data": {"type": "array", "items": ANY_OBJECT}},
                    )
                ),
            )
        },
    }


def _view_paths() -> dict[str, Any]:
    return {
        "/records/{id}/view": {"get": _op("A record as one HTML page.", HTML, params=[_path_id("id"), PAGE])},
        "/diff/{a}/{b}/view": {
            "get": _op(
                "Two records side by side, the first divergence highlighted.",
                HTML,
                params=[_path_id("a"), _path_id("b"), PAGE],
            )
        },
        "/healthz": {
            "get": _op(
                "Liveness (no token needed).", _json(_obj(["status"], {"status": {"const": "ok"}})), open_route=True
            )
        },
        "/metrics": {"get": _op("Prometheus text.", {"text/plain": {"schema": {"type": "string"}}})},
        "/openapi.json": {"get": _op("This document.", _json(ANY_OBJECT))},
    }


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "ctxlock serve", "version": "1", "description": "See docs/serving.md."},
        "paths": {**_anchor_paths(), **_own_paths(), **_view_paths()},
        "components": {
            "schemas": {"Error": ERROR, "VllmError": VLLM_ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
