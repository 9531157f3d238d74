"""The render and tokenize routes of each server kind, asked for one probe at a time.

- vLLM: `POST /tokenize`, its chat form (`{model, messages, tools, add_generation_prompt, continue_final_message,
  chat_template_kwargs, add_special_tokens}` -> `{tokens}`, vllm/entrypoints/serve/tokenize/serving.py), and
  `POST /v1/chat/completions/render` where the server has it. That route came with vLLM's render endpoints
  (https://github.com/vllm-project/vllm/pull/32473, merged January 2026) answering `[conversation, [{prompt,
  prompt_token_ids}]]`; since https://github.com/vllm-project/vllm/pull/35684 (March 2026) it answers a
  `GenerateRequest`, `{request_id, token_ids, features, sampling_params, ...}`, the ids only. Plain `vllm serve`
  registers it only with `--enable-scale-out` (`VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1` before that flag) since
  https://github.com/vllm-project/vllm/pull/54579 (September 2026); `vllm launch render` always does (and
  `ctxlock serve` answers it, docs/serve-compat.md). Both shapes are read; a 404, 405 or 501 means the route is
  absent, and the report says so.
- llama.cpp: `POST /apply-template` (`{messages, tools, add_generation_prompt, continue_final_message,
  chat_template_kwargs}` -> `{prompt}`), then `POST /tokenize` of that prompt with `add_special: true` and
  `parse_special: true`, as its chat path does (tools/server/server-context.cpp: the OpenAI-compatible path
  tokenizes the rendered prompt with `tokenize_input_prompts(..., add_special=true, parse_special=true)`).
- ctxlock: `POST /v1/render?model=NAME` with the request itself (`ctxlock render --json`'s answer: `text`,
  `input_ids`).

A probe whose request holds what a route has no field for (`documents` on vLLM's `/tokenize` and llama.cpp's
routes) is not sent there, and the result says why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ctxlock.errors import ServerAnswerError
from ctxlock.liveprobe._http import Answer, ServerClient
from ctxlock.liveprobe._servers import ServerInfo, ServerKind
from ctxlock.pipeline import Pipeline
from ctxlock.probes import Probe, ProbeRender
from ctxlock.tokenizer import Tokenizer

# Statuses that say something of the server, not of one probe: they stop the run (a typed error).
_FATAL = frozenset({401, 403, 429, 503})
# Statuses that say the route is not there.
_ABSENT = frozenset({404, 405, 501})
_CHAT_KEYS = ("messages", "tools", "chat_template_kwargs")
RENDER_ADDED = (
    "vLLM added it in January 2026 (https://github.com/vllm-project/vllm/pull/32473); since September 2026 plain "
    "`vllm serve` registers it only with --enable-scale-out (VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 before), and "
    "`vllm launch render` always does"
)


@dataclass(frozen=True)
class ServerRender:
    """What a route answered for one probe: its ids, and its own rendered text when the route gives one."""

    ids: tuple[int, ...]
    text: str | None
    template_sha256: str | None = None  # the template the server says it rendered with (ctxlock's /v1/render)


@dataclass(frozen=True)
class Refusal:
    """The server refused the probe: its status and its own message."""

    status: int
    message: str


class RouteAbsent(Exception):
    """The server has no such route (404, 405 or 501): `why` is the server's answer."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(why)


def ids_of(value: Any, where: str) -> tuple[int, ...]:
    """A list of token ids from a server's answer, checked: non-negative integers below 2**32."""
    if not isinstance(value, list):
        raise ServerAnswerError("the answer's token ids are not a list", path=where, hint="is this the route's shape?")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < 1 << 32:
            raise ServerAnswerError(f"token {i} is not a token id: {str(t)[:40]!r}", path=where)
    return tuple(value)


def _field(body: Any, key: str, where: str) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise ServerAnswerError(f"the answer has no {key!r}", path=where, hint="is this the route's shape?")
    return body[key]


class Route:
    """One route (or two-step flow) of a server kind, asked for probes; `name` is what the report calls it."""

    name = ""
    fields: tuple[str, ...] = _CHAT_KEYS  # the request keys the route has a place for
    text_kind = ""  # what the route's own text is, when it gives one
    absent_hint = ""  # what to know when the server has no such route

    def __init__(self, client: ServerClient, info: ServerInfo) -> None:
        self.client = client
        self.info = info

    def unsent(self, probe: Probe) -> tuple[str, ...]:
        """The request keys of `probe` this route has no field for."""
        return tuple(k for k in probe.request if k not in self.fields)

    def skip(self, probe: Probe) -> str | None:
        """Why `probe` is not sent to this route (None: it is)."""
        if "documents" in self.unsent(probe):
            return f"{self.name} has no field for the request's documents"
        return None

    def notes(self, probe: Probe) -> tuple[str, ...]:
        """What the result should say about how `probe` was sent (request keys the route has no field for)."""
        unsent = [k for k in self.unsent(probe) if k != "documents"]
        return (f"not sent ({self.name} has no field for them): {', '.join(unsent)}",) if unsent else ()

    def texts(self, pr: ProbeRender, sr: ServerRender, model: Pipeline) -> tuple[str, str, str] | None:
        """ctxlock's text and the server's, comparable, and what they are; None when the route gives no text."""
        if sr.text is None or pr.text is None:
            return None
        return pr.text, sr.text, self.text_kind

    def chat_body(self, probe: Probe, variables: Mapping[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.info.model} if self.info.model is not None else {}
        body.update({k: v for k, v in probe.request.items() if k in self.fields and k != "chat_template_kwargs"})
        kwargs = {**(probe.request.get("chat_template_kwargs") or {}), **(variables or {})}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        body["add_generation_prompt"] = probe.add_generation_prompt and not probe.continue_final_message
        if probe.continue_final_message:
            body["continue_final_message"] = True
        return body

    def call(self, route: str, body: Mapping[str, Any], *, absent_ok: bool = False) -> Answer | Refusal:
        """POST `body`: the answer, or the server's refusal of this probe; an absent route raises RouteAbsent when
        `absent_ok`, else (like a status that says something of the server itself) a ServerRefusedError."""
        answer = self.client.post(route, body)
        if answer.ok:
            return answer
        if answer.status in _ABSENT and absent_ok:
            raise RouteAbsent(f"HTTP {answer.status}: {answer.message}")
        if answer.status in _FATAL or answer.status in _ABSENT:
            hint = None
            if answer.status in _ABSENT:
                hint = f"is this a {self.info.kind} server ({self.info.detected})? pass --kind to say which it is"
            self.client.expect(answer, route, hint=hint)
        return Refusal(answer.status, answer.message)

    def ask(self, probe: Probe, variables: Mapping[str, Any] | None) -> ServerRender | Refusal:
        raise NotImplementedError


class _Vllm(Route):
    def texts(self, pr: ProbeRender, sr: ServerRender, model: Pipeline) -> tuple[str, str, str] | None:
        if sr.text is not None:
            return super().texts(pr, sr, model)
        if pr.ids is None:
            return None
        mine = vllm_detokenize(self.client, self.info, pr.ids)
        theirs = vllm_detokenize(self.client, self.info, sr.ids)
        if mine is None or theirs is None:
            return None
        return mine, theirs, "both id sequences decoded by the server's POST /detokenize"


class VllmTokenize(_Vllm):
    name = "POST /tokenize (vLLM's chat form)"

    def ask(self, probe: Probe, variables: Mapping[str, Any] | None) -> ServerRender | Refusal:
        body = {**self.chat_body(probe, variables), "add_special_tokens": False}
        answer = self.call("/tokenize", body)
        if isinstance(answer, Refusal):
            return answer
        where = self.client.where("/tokenize")
        return ServerRender(ids_of(_field(answer.body, "tokens", where), where), None)


class VllmRender(_Vllm):
    name = "POST /v1/chat/completions/render (vLLM)"
    fields = (*_CHAT_KEYS, "documents")
    text_kind = "the prompt vLLM's render route answered"
    absent_hint = RENDER_ADDED

    def skip(self, probe: Probe) -> str | None:
        return None

    def ask(self, probe: Probe, variables: Mapping[str, Any] | None) -> ServerRender | Refusal:
        route = "/v1/chat/completions/render"
        answer = self.call(route, self.chat_body(probe, variables), absent_ok=True)
        if isinstance(answer, Refusal):
            return answer
        where, body = self.client.where(route), answer.body
        if isinstance(body, dict):  # a GenerateRequest: the ids only
            return ServerRender(ids_of(_field(body, "token_ids", where), where), None)
        # The first shape: [conversation, engine prompts], each engine prompt {prompt, prompt_token_ids}.
        if isinstance(body, list) and len(body) == 2 and isinstance(body[1], list) and len(body[1]) == 1:
            prompt = body[1][0]
            text = prompt.get("prompt") if isinstance(prompt, dict) else None
            ids = ids_of(_field(prompt, "prompt_token_ids", where), where)
            return ServerRender(ids, text if isinstance(text, str) else None)
        raise ServerAnswerError(
            "neither a GenerateRequest {token_ids} nor [conversation, [{prompt_token_ids}]]",
            path=where,
            hint="an answer shape of this route ctxlock does not know: please report it with the vLLM version",
        )


class LlamaCppTemplate(Route):
    name = "POST /apply-template + POST /tokenize (llama.cpp's chat path)"
    text_kind = "the prompt /apply-template answered"

    def notes(self, probe: Probe) -> tuple[str, ...]:
        messages = probe.request.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        prefill = isinstance(last, dict) and last.get("role") == "assistant" and not probe.continue_final_message
        extra = (PREFILL,) if prefill else ()
        return super().notes(probe) + extra

    def texts(self, pr: ProbeRender, sr: ServerRender, model: Pipeline) -> tuple[str, str, str] | None:
        if sr.text is None or pr.text is None:
            return None
        cut = llama_cut(pr.text, model.tokenizer)
        return cut, sr.text, self.text_kind + (CUT if cut != pr.text else "")

    def ask(self, probe: Probe, variables: Mapping[str, Any] | None) -> ServerRender | Refusal:
        answer = self.call("/apply-template", self.chat_body(probe, variables))
        if isinstance(answer, Refusal):
            return answer
        prompt = _field(answer.body, "prompt", self.client.where("/apply-template"))
        if not isinstance(prompt, str):
            raise ServerAnswerError("the prompt is not a string", path=self.client.where("/apply-template"))
        body: dict[str, Any] = {"content": prompt, "add_special": True, "parse_special": True}
        if self.info.model is not None:
            body["model"] = self.info.model
        tokens = self.call("/tokenize", body)
        if isinstance(tokens, Refusal):
            return tokens
        where = self.client.where("/tokenize")
        return ServerRender(ids_of(_field(tokens.body, "tokens", where), where), prompt)


class CtxlockRender(Route):
    name = "POST /v1/render (ctxlock's own)"
    text_kind = "the text /v1/render answered"

    def unsent(self, probe: Probe) -> tuple[str, ...]:
        return ()

    def skip(self, probe: Probe) -> str | None:
        return None

    def ask(self, probe: Probe, variables: Mapping[str, Any] | None) -> ServerRender | Refusal:
        query = [f"model={quote(self.info.model, safe='')}"] if self.info.model is not None else []
        if probe.continue_final_message:
            query.append("continue_final_message=1")
        elif not probe.add_generation_prompt:
            query.append("no_generation_prompt=1")
        request = dict(probe.request)
        kwargs = {**(request.get("chat_template_kwargs") or {}), **(variables or {})}
        if kwargs:
            request["chat_template_kwargs"] = kwargs
        route = "/v1/render" + ("?" + "&".join(query) if query else "")
        answer = self.call(route, request)
        if isinstance(answer, Refusal):
            return answer
        where = self.client.where(route)
        text = _field(answer.body, "text", where)
        if not isinstance(text, str):  # else the report would say the route gives no text to compare
            raise ServerAnswerError(
                f"the answer's text is not a string: {str(text)[:40]!r}", path=where, hint="is this the route's shape?"
            )
        template = answer.body.get("template")
        sha = template.get("sha256") if isinstance(template, dict) else None
        return ServerRender(
            ids_of(_field(answer.body, "input_ids", where), where),
            text,
            sha if isinstance(sha, str) else None,
        )


# llama.cpp renders a conversation that ends with an assistant message as that message's continuation (its
# `prefill_assistant` option, on unless `--no-prefill-assistant`; tools/server/server-common.cpp,
# `oaicompat_chat_params_parse`); ctxlock renders what the probe asks.
PREFILL = (
    "the conversation ends with an assistant message: llama-server continues it (prefill) unless started with "
    "--no-prefill-assistant"
)
CUT = "; ctxlock's text without the BOS (EOS) text the tokenizer adds itself, as llama.cpp's /apply-template cuts it"


def special_affixes(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What `add_special_tokens=True` adds around a text (the ids before and after the text's own), read off one
    probe text, as `ctxlock serve` reads them (src/ctxlock/server/models.py)."""
    plain = tokenizer.encode("a")
    full = tokenizer.encode("a", add_special_tokens=True)
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return tuple(full[:k]), tuple(full[k + len(plain) :])
    return (), ()


def llama_cut(text: str, tokenizer: Tokenizer) -> str:
    """`text` as llama.cpp's /apply-template answers a render: a leading BOS text cut when the tokenizer adds a BOS
    itself, a trailing EOS text when it adds an EOS (common/chat.cpp, `common_chat_template_direct_apply`)."""
    prefix, suffix = special_affixes(tokenizer)
    if len(prefix) == 1 and (bos := tokenizer.id_to_token(prefix[0])) and text.startswith(bos):
        text = text[len(bos) :]
    if len(suffix) == 1 and (eos := tokenizer.id_to_token(suffix[0])) and text.endswith(eos):
        text = text[: -len(eos)]
    return text


def routes_for(client: ServerClient, info: ServerInfo) -> list[Route]:
    """The routes `ctxlock probe` asks a server of this kind, in the report's order."""
    if info.kind is ServerKind.VLLM:
        return [VllmTokenize(client, info), VllmRender(client, info)]
    if info.kind is ServerKind.LLAMACPP:
        return [LlamaCppTemplate(client, info)]
    return [CtxlockRender(client, info)]


def vllm_detokenize(client: ServerClient, info: ServerInfo, ids: tuple[int, ...]) -> str | None:
    """The text vLLM's (or ctxlock's vLLM-shape) `POST /detokenize` gives for `ids`; None when it refuses them."""
    body: dict[str, Any] = {"tokens": list(ids)}
    if info.model is not None:
        body["model"] = info.model
    answer = client.post("/detokenize", body)
    if not answer.ok:
        return None
    text = answer.body.get("prompt") if isinstance(answer.body, dict) else None
    return text if isinstance(text, str) else None
