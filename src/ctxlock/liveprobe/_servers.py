"""Which server answers at a URL (vLLM, llama.cpp's llama-server, `ctxlock serve`), which model it serves, and what
it says about its template and tokenizer.

Detection reads `GET /v1/models` first, which all three serve: ctxlock's rows carry `tokenizer.sha256`, vLLM's are
`owned_by: "vllm"` (vllm/entrypoints/openai/models/protocol.py, `ModelCard`), llama.cpp's `owned_by: "llamacpp"`
(tools/server/server-context.cpp, `get_res_model_info`). When that does not tell, `GET /props` (llama.cpp) and
`GET /version` (vLLM) do. `--kind` skips the guess; the report says what was given and what was seen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ctxlock.errors import InputError, ServerAnswerError
from ctxlock.liveprobe._http import Answer, ServerClient, one_line


class ServerKind(StrEnum):
    """The server families `ctxlock probe` knows the routes of."""

    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    CTXLOCK = "ctxlock"


@dataclass(frozen=True)
class ServerInfo:
    """The server as probed: its kind and how that was found, the model asked for, and what it says of itself."""

    url: str
    kind: ServerKind
    detected: str
    model: str | None
    models: tuple[str, ...]
    version: str | None = None
    vocab_size: int | None = None  # llama.cpp's /v1/models `meta.n_vocab`
    tokenizer_sha256: str | None = None  # ctxlock's /v1/models `tokenizer.sha256`

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "kind": str(self.kind),
            "detected": self.detected,
            "model": self.model,
            "models": list(self.models),
            "version": self.version,
        }


def _rows(answer: Answer) -> list[dict[str, Any]]:
    body = answer.body if answer.ok else None
    data = body.get("data") if isinstance(body, dict) else None
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def _kind_of_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[ServerKind | None, str]:
    for row in rows:
        tok = row.get("tokenizer")
        if isinstance(tok, dict) and isinstance(tok.get("sha256"), str):
            return ServerKind.CTXLOCK, "GET /v1/models: its rows carry tokenizer.sha256 (ctxlock serve)"
        owner = row.get("owned_by")
        if owner == "vllm":
            return ServerKind.VLLM, "GET /v1/models: owned_by 'vllm'"
        if owner == "llamacpp":
            return ServerKind.LLAMACPP, "GET /v1/models: owned_by 'llamacpp' (llama-server)"
    return None, ""


def _version(client: ServerClient, kind: ServerKind) -> tuple[str | None, Mapping[str, Any] | None]:
    """vLLM's `/version`, llama.cpp's `/props` `build_info` (and the props, for the template); ctxlock names none."""
    if kind is ServerKind.CTXLOCK:
        return None, None
    answer = client.get("/version" if kind is ServerKind.VLLM else "/props")
    body = answer.body if answer.ok and isinstance(answer.body, dict) else None
    if body is None:
        return None, None
    value = body.get("version" if kind is ServerKind.VLLM else "build_info")
    return (one_line(value, 80) if isinstance(value, str) else None), body


def _guess(client: ServerClient) -> tuple[ServerKind | None, str]:
    props = client.get("/props")
    if props.ok and isinstance(props.body, dict) and ("build_info" in props.body or "chat_template" in props.body):
        return ServerKind.LLAMACPP, "GET /props answers llama.cpp's properties"
    version = client.get("/version")
    if version.ok and isinstance(version.body, dict) and isinstance(version.body.get("version"), str):
        return ServerKind.VLLM, "GET /version answers vLLM's {version}"
    return None, ""


def _model(kind: ServerKind, rows: Sequence[Mapping[str, Any]], served_model: str | None, where: str) -> str | None:
    names = [r["id"] for r in rows if isinstance(r.get("id"), str)]
    if served_model is not None:
        if names and served_model not in names and kind is not ServerKind.LLAMACPP:
            raise InputError(
                f"the server does not serve {served_model!r}",
                path="--served-model",
                hint=f"it serves: {', '.join(one_line(n, 80) for n in names[:20])}",
            )
        return served_model
    if kind is ServerKind.CTXLOCK:
        default = [r["id"] for r in rows if r.get("default") is True and isinstance(r.get("id"), str)]
        return default[0] if default else (names[0] if names else None)
    if kind is ServerKind.VLLM:  # the base model, not a LoRA adapter (whose row names its `parent`)
        names = [r["id"] for r in rows if isinstance(r.get("id"), str) and r.get("parent") is None] or names
    if len(names) > 1:
        raise InputError(
            f"{where} serves {len(names)} models",
            path="--served-model",
            hint=f"name the one to probe: {', '.join(one_line(n, 80) for n in names[:20])}",
        )
    return names[0] if names else None


def _sub(row: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = row.get(key)
    return value if isinstance(value, dict) else {}


def detect(
    client: ServerClient, kind: ServerKind | str | None = None, served_model: str | None = None
) -> tuple[ServerInfo, Mapping[str, Any] | None]:
    """The server at `client`'s URL: its kind (given, or detected), the served model to probe and what it says of
    itself; with llama.cpp's `/props` (the template it serves) when it is one."""
    models = client.get("/v1/models")
    if models.status in (401, 403):
        client.expect(models, "/v1/models")
    rows = _rows(models)
    seen, how = _kind_of_rows(rows)
    if seen is None:
        seen, how = _guess(client)
    if kind is not None:
        given = ServerKind(kind)
        if seen is not None and seen is not given:
            detected = f"given (--kind {given}); the server looks like {seen}: {how}"
        else:
            detected = f"given (--kind {given})" + (f"; {how}" if how else "")
        seen = given
    elif seen is None:
        raise ServerAnswerError(
            "cannot tell which server this is (GET /v1/models, /props and /version did not say)",
            path=client.url,
            hint="pass --kind vllm, --kind llamacpp or --kind ctxlock",
        )
    else:
        detected = how
    version, extra = _version(client, seen)
    model = _model(seen, rows, served_model, client.url)
    row = next((r for r in rows if r.get("id") == model), rows[0] if rows else {})
    n_vocab = _sub(row, "meta").get("n_vocab")
    tok = _sub(row, "tokenizer")
    info = ServerInfo(
        url=client.url,
        kind=seen,
        detected=detected,
        model=model,
        models=tuple(r["id"] for r in rows if isinstance(r.get("id"), str)),
        version=version,
        vocab_size=n_vocab if isinstance(n_vocab, int) and not isinstance(n_vocab, bool) else None,
        tokenizer_sha256=tok.get("sha256") if isinstance(tok.get("sha256"), str) else None,
    )
    return info, (extra if seen is ServerKind.LLAMACPP else None)
