"""`ctxlock probe --manifest`: a training set's manifest (its template and tokenizer digests) against what a live
server serves.

The manifest is a JSON object (read as hostile input: bounded, strict JSON). The keys read:

- `template_sha256`: the sha256 of the template source (`ChatTemplate.sha256`: the UTF-8 text as rendered), either
  one hex digest or, as `ctxlock batch` writes it in `manifest.json`, an object of the model's templates by name,
  whose `default` is the one the rows were rendered with (a one-entry object: that entry);
- `tokenizer_sha256`: the digest ctxlock gives the tokenizer (`Tokenizer.sha256`), as `ctxlock batch` writes it;
- `model`: what made it, shown in the report.

The rest of a batch manifest (shards, counts, policy) is not read. At least one digest must be there.

What the server serves: vLLM's `GET /tokenizer_info` (`chat_template`, served only with
`--enable-tokenizer-info-endpoint`, and holding the template only when vLLM was given one with `--chat-template` or
its tokenizer config has one), llama.cpp's `GET /props` (`chat_template`), ctxlock's `GET /tokenizer_info` and
`GET /v1/models` (`tokenizer.sha256`). Neither vLLM nor llama.cpp answers a tokenizer digest: that check says so,
and names the local model files' digest when `--model` was given, whose ids the probes compare with the server's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ctxlock.errors import InputError
from ctxlock.liveprobe._http import ServerClient
from ctxlock.liveprobe._servers import ServerInfo, ServerKind
from ctxlock.outside import loads_outside, read_input
from ctxlock.template import ChatTemplate

_HEX64 = re.compile(r"[0-9a-f]{64}")
SAME, DIFFERS, NOT_CHECKED = "same", "differs", "not checked"


@dataclass(frozen=True)
class Manifest:
    """The digests a training set's manifest holds: the training template's, the other named ones, the tokenizer's."""

    source: str
    template_sha256: str | None
    templates: Mapping[str, str] = field(default_factory=dict)  # every named template's digest (ctxlock batch's)
    tokenizer_sha256: str | None = None
    model: str | None = None


def _digest(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise InputError("not a sha256 (64 lowercase hex digits)", path=where, hint="as ctxlock batch writes it")
    return value


def _templates(value: Any, where: str) -> tuple[str | None, dict[str, str]]:
    if isinstance(value, str):
        return _digest(value, where), {}
    if not isinstance(value, dict):
        raise InputError("a sha256, or an object of sha256s by template name", path=where, hint='{"default": "..."}')
    named = {str(k): _digest(v, f"{where}.{k}") for k, v in value.items()}
    if "default" in named:
        return named["default"], named
    if len(named) == 1:
        return next(iter(named.values())), named
    raise InputError(
        "several templates and none is `default`: which one made the rows?",
        path=where,
        hint="give the training template's digest as a string",
    )


def read_manifest(path: str | Path) -> Manifest:
    """The digests of a manifest file (`ctxlock batch`'s `manifest.json`, or an object with the same keys)."""
    label = str(path)
    data = loads_outside(read_input(path, label=f"--manifest {label}"), f"--manifest {label} $", error=InputError)
    if not isinstance(data, dict):
        raise InputError("a manifest is a JSON object", path=f"--manifest {label}", hint='{"template_sha256": ...}')
    where = f"--manifest {label} $"
    template, named = (
        (None, {})
        if data.get("template_sha256") is None
        else _templates(data["template_sha256"], f"{where}.template_sha256")
    )
    tokenizer = (
        None if data.get("tokenizer_sha256") is None else _digest(data["tokenizer_sha256"], f"{where}.tokenizer_sha256")
    )
    if template is None and tokenizer is None:
        raise InputError(
            "the manifest holds neither template_sha256 nor tokenizer_sha256",
            path=f"--manifest {label}",
            hint="a ctxlock batch manifest.json has both",
        )
    model = data.get("model")
    return Manifest(label, template, named, tokenizer, model if isinstance(model, str) else None)


@dataclass(frozen=True)
class DigestCheck:
    """One digest of the manifest against the server's: the status (`same`, `differs`, `not checked`), the server's
    digest and where it came from (or why there is none), and the local model files' digest when known."""

    what: str
    status: str
    manifest: str | None
    server: str | None
    detail: str
    local: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "status": self.status,
            "manifest": self.manifest,
            "server": self.server,
            "local": self.local,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class ManifestCheck:
    source: str
    model: str | None
    checks: tuple[DigestCheck, ...]

    @property
    def differs(self) -> bool:
        return any(c.status == DIFFERS for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "model": self.model, "checks": [c.to_dict() for c in self.checks]}


def served_template(client: ServerClient, info: ServerInfo, props: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """The template source the server says it serves, and where that came from (or why there is none)."""
    if info.kind is ServerKind.LLAMACPP:
        if props is None:
            return None, "the server answers no GET /props"
        source = props.get("chat_template")
        if isinstance(source, str) and source:
            return source, "GET /props chat_template"
        return None, "llama-server's GET /props has no chat_template"
    route = "/tokenizer_info"
    if info.kind is ServerKind.CTXLOCK and info.model is not None:
        route += f"?model={quote(info.model, safe='')}"
    answer = client.get(route)
    if answer.status in (404, 405):
        why = "the server has no GET /tokenizer_info"
        if info.kind is ServerKind.VLLM:
            why += " (vLLM serves it only with --enable-tokenizer-info-endpoint)"
        return None, why
    body = client.expect(answer, route)
    source = body.get("chat_template") if isinstance(body, dict) else None
    if isinstance(source, str) and source:
        return source, f"GET {route} chat_template"
    why = f"GET {route} answers no chat_template"
    if info.kind is ServerKind.VLLM:
        why += " (vLLM names its template there when given --chat-template, or when the tokenizer config holds one)"
    return None, why


def _template_check(manifest: Manifest, served: tuple[str | None, str], local: str | None) -> DigestCheck:
    source, where = served
    if manifest.template_sha256 is None:
        return DigestCheck("template", NOT_CHECKED, None, None, "the manifest has no template_sha256", local)
    if source is None:
        return DigestCheck("template", NOT_CHECKED, manifest.template_sha256, None, where, local)
    digest = ChatTemplate(source=source, id="served").sha256
    if digest == manifest.template_sha256:
        return DigestCheck("template", SAME, manifest.template_sha256, digest, where, local)
    # llama-server answers the template without the file's final newline, which Jinja drops when it renders
    # (keep_trailing_newline is off in transformers' environment): the same template.
    with_newline = ChatTemplate(source=source + "\n", id="served").sha256
    if with_newline == manifest.template_sha256:
        detail = f"{where}, without the file's final newline (Jinja drops it when rendering: the same template)"
        return DigestCheck("template", SAME, manifest.template_sha256, with_newline, detail, local)
    other = [name for name, d in manifest.templates.items() if d == digest]
    detail = where + (f"; it is the manifest's {other[0]!r} template, not the one the rows used" if other else "")
    return DigestCheck("template", DIFFERS, manifest.template_sha256, digest, detail, local)


def _tokenizer_check(manifest: Manifest, info: ServerInfo, local: str | None) -> DigestCheck:
    want = manifest.tokenizer_sha256
    if want is None:
        return DigestCheck("tokenizer", NOT_CHECKED, None, None, "the manifest has no tokenizer_sha256", local)
    if info.tokenizer_sha256 is not None:
        status = SAME if info.tokenizer_sha256 == want else DIFFERS
        return DigestCheck("tokenizer", status, want, info.tokenizer_sha256, "GET /v1/models tokenizer.sha256", local)
    why = f"{info.kind} answers no tokenizer digest"
    if info.vocab_size is not None:
        why += f" (its /v1/models gives n_vocab {info.vocab_size})"
    if local is not None:
        why += (
            "; the local model files' tokenizer "
            + ("is the manifest's" if local == want else "is NOT the manifest's")
            + ", and the probes compare the server's ids with its ids"
        )
    return DigestCheck("tokenizer", NOT_CHECKED, want, None, why, local)


def check_manifest(
    client: ServerClient,
    info: ServerInfo,
    props: Mapping[str, Any] | None,
    manifest: Manifest,
    *,
    local_template: str | None = None,
    local_tokenizer: str | None = None,
) -> ManifestCheck:
    """The manifest's digests against the server's (and the local model files' when given)."""
    checks = (
        _template_check(manifest, served_template(client, info, props), local_template),
        _tokenizer_check(manifest, info, local_tokenizer),
    )
    return ManifestCheck(manifest.source, manifest.model, checks)
