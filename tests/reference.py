"""The transformers oracle: what ``tokenizer.apply_chat_template`` produces, for differential tests.

Test-only. transformers is imported lazily inside the functions (importing it costs about a second), and
ctxlock is never imported here. Errors are not caught or translated: whatever transformers raises (jinja2
``TemplateError`` from ``raise_exception``, ``ValueError`` for incompatible options, ...) propagates, so tests
can compare ctxlock's messages with the reference's.

- ``reference_render``: rendered text without any tokenizer (special tokens given explicitly).
- ``reference_ids``: ids from a saved HF tokenizer dir (e.g. ``fetched.hf_tokenizer_dir("qwen2")``).
- ``reference_assistant_mask``: ids and ``return_assistant_tokens_mask``'s mask, from a saved HF tokenizer dir.
- ``reference_encode``, ``reference_special_tokens``, ``reference_tokenizer``: the tokenizer's own view.

The results of ``reference_render``, ``reference_ids`` and ``reference_assistant_mask`` are cached on disk, once per
pinned transformers version (``<test cache>/reference-outputs/transformers-<version>/``, keyed by the sha256 of every
input: the template, the messages, the options, and for ids and masks the tokenizer directory's files; for a
template that reads the clock, the day, or the fixed clock given). A run after the first reads them instead of
calling transformers again. ``CTXLOCK_TEST_REFERENCE_CACHE=0`` turns the cache off;
tests/project/test_reference_cache.py holds cached answers to fresh ones. For renders and ids only answers are
cached: an input transformers refuses raises again each time. For masks a refusal is cached too, as its exception's
type and message, and raised each time as ``ReferenceRefusal``: a mask test walks every training row of a template,
and a template that refuses most of them (a tool call without an id) would otherwise load the tokenizer again on
every run.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fetched

__all__ = [
    "ReferenceRefusal",
    "reference_assistant_mask",
    "reference_encode",
    "reference_ids",
    "reference_render",
    "reference_special_tokens",
    "reference_tokenizer",
]


CACHE_ENV = "CTXLOCK_TEST_REFERENCE_CACHE"


@functools.cache
def _transformers_version() -> str:
    return importlib.metadata.version("transformers")  # reads the package's metadata file: about 10 ms a call


def _cache_root() -> Path:
    return fetched.cache_dir() / "reference-outputs" / f"transformers-{_transformers_version()}"


def cached(namespace: str, key: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
    """``compute()``, answered from the disk cache when the same inputs were computed before (see the module
    docstring). Inputs that are not plain JSON are never cached."""
    if os.environ.get(CACHE_ENV, "1").lower() in ("0", "off", "false"):
        return compute()
    try:
        text = json.dumps(key, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return compute()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    path = _cache_root() / namespace / digest[:2] / f"{digest}.json"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("key") == text:
            return stored["value"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": text, "value": value}, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a parallel worker writing the same answer is harmless
    return value


def _clock(template: str) -> str | None:
    """Today (UTC) for a template that can read the clock (transformers gives templates ``strftime_now``)."""
    return datetime.datetime.now(datetime.UTC).date().isoformat() if "strftime_now" in template else None


@functools.cache
def _dir_digest(resolved_dir: str) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(resolved_dir).iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _template_only_tokenizer() -> Any:
    """A tokenizer with an empty special-token map and no chat template of its own.

    ``apply_chat_template(tokenize=False)`` never touches the vocabulary: it resolves the template, normalizes
    the messages (``_normalize_chat_messages`` drops None-valued keys), rejects ``continue_final_message`` with
    ``add_generation_prompt``, and calls ``render_jinja_template`` with ``{**special_tokens_map, **kwargs}``.
    Calling the real method on this stub reproduces all of that, in transformers' own order, with the special
    tokens supplied as kwargs instead of coming from a vocabulary.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import TokenizersBackend

    stub = TokenizersBackend(tokenizer_object=Tokenizer(WordLevel({"<unused>": 0}, unk_token="<unused>")))
    if stub.special_tokens_map or stub.chat_template is not None:  # guard against a future default
        raise RuntimeError(f"template-only tokenizer is not empty: {stub.special_tokens_map!r}")
    return stub


def reference_render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    special_tokens: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> str:
    """``tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, ...)``, tokenizer-free.

    ``special_tokens`` stands for the tokenizer's ``special_tokens_map`` (e.g. ``{"bos_token": "<s>"}``, or
    ``reference_special_tokens(dir)``); ``kwargs`` are extra template variables and override it, as in
    transformers. ``continue_final_message`` may be a field name (e.g. ``"reasoning_content"``), as in 5.x.
    """

    def compute() -> str:
        return _template_only_tokenizer().apply_chat_template(
            list(messages),
            tools=tools,
            documents=documents,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **{**dict(special_tokens or {}), **kwargs},
        )

    key = {
        "template": template,
        "messages": list(messages),
        "tools": tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "variables": {**dict(special_tokens or {}), **kwargs},
        "day": _clock(template),
    }
    return cached("render", key, compute)


@functools.lru_cache(maxsize=32)
def _load_tokenizer(resolved_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolved_dir)


def reference_tokenizer(tokenizer_dir: Path | str) -> Any:
    """``AutoTokenizer.from_pretrained(tokenizer_dir)``, loaded once per directory."""
    return _load_tokenizer(str(Path(tokenizer_dir).resolve()))


def _flat_ids(out: Any) -> list[int]:
    if isinstance(out, Mapping) or hasattr(out, "keys"):  # BatchEncoding / dict, whatever return_dict gives
        out = out["input_ids"]
    if hasattr(out, "tolist"):  # tensors / arrays
        out = out.tolist()
    ids = list(out)
    if len(ids) == 1 and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TypeError(f"expected a flat list of ints from transformers, got {type(out).__name__}: {out!r:.200}")
    return ids


def reference_ids(
    tokenizer_dir: Path | str,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **kwargs: Any,
) -> list[int]:
    """``apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=False, ...)`` as ints.

    The tokenizer's own ``special_tokens_map`` feeds the template; kwargs override it. Tokenization happens with
    ``add_special_tokens=False`` and special-token matching on, exactly as transformers does.
    """

    def compute() -> list[int]:
        out = reference_tokenizer(tokenizer_dir).apply_chat_template(
            list(messages),
            tools=tools,
            documents=documents,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        return _flat_ids(out)

    key = _chat_key(tokenizer_dir, template, messages, tools, documents, add_generation_prompt, continue_final_message)
    return cached("ids", {**key, "variables": kwargs, "day": _clock(template)}, compute)


def _chat_key(
    tokenizer_dir: Path | str,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: list[dict] | None,
    documents: list[dict] | None,
    add_generation_prompt: bool,
    continue_final_message: bool | str,
) -> dict[str, Any]:
    """The inputs of an ``apply_chat_template`` call that every cached answer of it is keyed by."""
    return {
        "tokenizer": _dir_digest(str(Path(tokenizer_dir).resolve())),
        "template": template,
        "messages": list(messages),
        "tools": tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
    }


class ReferenceRefusal(Exception):
    """transformers refused the input (``reference_assistant_mask``): the type of what it raised, and its message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def _fixed_clock(now: datetime.datetime) -> type[datetime.datetime]:
    """A ``datetime`` class whose ``now()`` is ``now``: its wall time without a zone, or converted to the zone asked
    for."""

    class Fixed(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
            return now.replace(tzinfo=None) if tz is None else now.astimezone(tz)

    return Fixed


def reference_assistant_mask(
    tokenizer_dir: Path | str,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    now: datetime.datetime | None = None,
    **kwargs: Any,
) -> dict[str, list[int]]:
    """``apply_chat_template(..., tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`` as
    ``{"input_ids": [...], "assistant_masks": [...]}``, the mask transformers derives from the template's
    ``{% generation %}`` blocks. ``now`` fixes the clock ``strftime_now`` reads (transformers' module-level
    ``datetime`` is replaced for the call); without it the machine's clock is read and the day is part of the key.
    A refusal (whatever transformers or the template raises) is ``ReferenceRefusal``, cached like an answer."""

    def compute() -> dict[str, Any]:
        import transformers.utils.chat_template_utils as ctu

        saved = ctu.datetime
        if now is not None:
            ctu.datetime = _fixed_clock(now)
        try:
            out = reference_tokenizer(tokenizer_dir).apply_chat_template(
                [dict(m) for m in messages],
                tools=tools,
                documents=documents,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **kwargs,
            )
        except Exception as exc:  # the template's raise_exception, an undefined value, an option transformers refuses
            return {"refused": {"kind": type(exc).__name__, "message": str(exc)}}
        finally:
            ctu.datetime = saved
        return {"input_ids": _flat_ids(out), "assistant_masks": [int(v) for v in out["assistant_masks"]]}

    key = _chat_key(tokenizer_dir, template, messages, tools, documents, add_generation_prompt, continue_final_message)
    clock = now.isoformat() if now is not None else _clock(template)
    answer = cached("assistant-masks", {**key, "variables": kwargs, "clock": clock}, compute)
    if "refused" in answer:
        raise ReferenceRefusal(answer["refused"]["kind"], answer["refused"]["message"])
    return answer


def reference_encode(tokenizer_dir: Path | str, text: str, add_special_tokens: bool = False) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=...)`` (special-token strings in text are matched)."""
    return _flat_ids(reference_tokenizer(tokenizer_dir).encode(text, add_special_tokens=add_special_tokens))


def reference_special_tokens(tokenizer_dir: Path | str) -> dict[str, str]:
    """``tokenizer.special_tokens_map`` as plain strings, e.g. ``{"bos_token": "<|endoftext|>", ...}``.

    This is exactly what ``apply_chat_template`` passes to the template, so
    ``reference_render(t, m, special_tokens=reference_special_tokens(d))`` renders what the tokenizer renders.
    """
    out: dict[str, Any] = {}
    for key, value in reference_tokenizer(tokenizer_dir).special_tokens_map.items():
        out[key] = [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)
    return out
