"""A model's capacity: its context window and its output limit, read from what its files (or a price table) state,
with the source of each number, every value found, and every conflict or ignored value said.

Pure: the loaders (`ctxlock.artifacts`) read the files and pass their parsed contents here.

Where a window comes from, first found wins (each source is named in `Capacity.source`):

1. a flag (`--context-window`, `--max-output-tokens`): `override`;
2. a price table entry (`with_price`): LiteLLM's `max_input_tokens` (the input limit the provider serves) and
   `max_output_tokens`, else its legacy `max_tokens` for the output limit; it describes the deployment, so it wins
   over the files;
3. `config.json`: `max_position_embeddings`, `max_sequence_length`, `n_positions`, `max_seq_len`, `seq_length`
   (the first present; several that disagree give the smallest, said in a note), read from `text_config` for
   multimodal configs. `sliding_window` is an attention span, never a window, and is not read;
4. Mistral's `params.json` `max_seq_len` (as vLLM maps it);
5. a GGUF file's `<general.architecture>.context_length`;
6. `tokenizer_config.json` `model_max_length`, unless it is transformers' "no limit" sentinel (int(1e30), and
   anything at or above int(1e20), LARGE_INTEGER).

A Mistral tokenizer file (`tekken.json`, `tokenizer.model.v*`) states no window (its `default_vocab_size` of
131,072 is a vocabulary size), so the built-in `mistral-nemo` and the `book` fixture have none: `source` is
"unknown". Every other value found is kept in `found`, and one that differs from the one used is a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxlock.economics._usage import Price

# transformers: VERY_LARGE_INTEGER = int(1e30) is what `model_max_length` holds when nothing sets it, and
# LARGE_INTEGER = int(1e20) its smaller cousin. Neither is a window.
LARGE_INTEGER = int(1e20)
WINDOW_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "max_seq_len", "seq_length")
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Found:
    """One value a source states: `kind` is "window" or "output"."""

    kind: str
    source: str
    value: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source, "value": self.value}


@dataclass(frozen=True)
class Capacity:
    """The context window (input + output, in tokens) and the output limit, each with its source ("unknown" when
    nothing states it), every value found, and notes on conflicts and ignored values."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    source: str = UNKNOWN
    output_source: str = UNKNOWN
    found: tuple[Found, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "context_window": self.context_window,
            "source": self.source,
            "max_output_tokens": self.max_output_tokens,
            "output_source": self.output_source,
            "found": [f.to_dict() for f in self.found],
            "notes": list(self.notes),
        }


def _count(value: Any) -> int | None:
    """A positive integer token count, or None (a float that is an integer counts: JSON writers emit 32768.0)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _read(values: Mapping[str, Any], key: str, source: str, notes: list[str]) -> int | None:
    if key not in values or values[key] is None:
        return None
    n = _count(values[key])
    if n is None:
        notes.append(f"{source} {key} {values[key]!r:.40} is not a positive integer: ignored")
    return n


def _from_config(config: Mapping[str, Any], name: str, notes: list[str]) -> list[Found]:
    text = config.get("text_config")
    where = name
    if isinstance(text, Mapping) and any(k in text for k in WINDOW_KEYS):
        config, where = text, f"{name} text_config"  # multimodal: the language model's positions
    values = [(k, n) for k in WINDOW_KEYS if (n := _read(config, k, where, notes)) is not None]
    if len({n for _, n in values}) > 1:
        smallest = min(values, key=lambda kv: kv[1])
        listed = ", ".join(f"{k} {n:,}" for k, n in values)
        notes.append(f"{where} states several windows ({listed}): using the smallest, {smallest[0]}")
        values = [smallest]
    rope = config.get("rope_scaling")
    if values and isinstance(rope, Mapping) and rope.get("factor") not in (None, 1, 1.0):
        kind = rope.get("rope_type") or rope.get("type")
        notes.append(
            f"{where} rope_scaling {kind} factor {rope.get('factor')}: the window is {values[0][0]} as written "
            "(vLLM multiplies it by the factor for some scaling types; pass --context-window to use that)"
        )
    return [Found("window", f"{where} {k}", n) for k, n in values[:1]]


def from_files(
    *,
    config: Mapping[str, Any] | None = None,
    tokenizer_config: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    gguf: Mapping[str, Any] | None = None,
    gguf_name: str = "GGUF",
) -> Capacity:
    """The capacity a model's files state: `config` (config.json), `tokenizer_config` (tokenizer_config.json),
    `params` (Mistral's params.json), `gguf` ({"architecture": ..., "context_length": ...} from a GGUF header)."""
    notes: list[str] = []
    found: list[Found] = []
    if config:
        found += _from_config(config, "config.json", notes)
    if params and (n := _read(params, "max_seq_len", "params.json", notes)) is not None:
        found.append(Found("window", "params.json max_seq_len", n))
    if gguf and gguf.get("context_length") is not None:
        key = f"{gguf.get('architecture')}.context_length"
        if (n := _read({key: gguf["context_length"]}, key, gguf_name, notes)) is not None:
            found.append(Found("window", f"{gguf_name} {key}", n))
    if tokenizer_config and tokenizer_config.get("model_max_length") is not None:
        raw = tokenizer_config["model_max_length"]
        if isinstance(raw, int | float) and not isinstance(raw, bool) and raw >= LARGE_INTEGER:
            notes.append(
                f"tokenizer_config.json model_max_length {raw:.3g} is transformers' 'no limit' sentinel: ignored"
            )
        elif (n := _read(tokenizer_config, "model_max_length", "tokenizer_config.json", notes)) is not None:
            found.append(Found("window", "tokenizer_config.json model_max_length", n))
    return _decide(tuple(found), tuple(notes))


def _decide(found: tuple[Found, ...], notes: tuple[str, ...]) -> Capacity:
    """The first window and the first output limit found (the list is in precedence order), with a note for every
    other value that differs from the one used."""
    out = list(notes)
    chosen: dict[str, Found] = {}
    for f in found:
        first = chosen.setdefault(f.kind, f)
        if first is not f and f.value != first.value:
            why = "" if f.kind == "output" else _why(first)
            out.append(f"{f.source} {f.value:,} differs from {first.source} {first.value:,}: using {first.source}{why}")
    window, output = chosen.get("window"), chosen.get("output")
    return Capacity(
        context_window=window.value if window else None,
        max_output_tokens=output.value if output else None,
        source=window.source if window else UNKNOWN,
        output_source=output.source if output else UNKNOWN,
        found=found,
        notes=tuple(out),
    )


def _why(first: Found) -> str:
    if first.source.startswith("config.json"):
        return " (the model's own positions; model_max_length is the tokenizer's truncation default)"
    if first.source.startswith(("price table", "--")):
        return " (it names the deployment)"
    return ""


def with_price(capacity: Capacity, price: Price, table: str) -> Capacity:
    """The capacity with a price table entry's limits put first (LiteLLM's `max_input_tokens`, `max_output_tokens`,
    else the legacy `max_tokens` as the output limit)."""
    head: list[Found] = []
    where = f"price table {table} {price.name}"
    if price.max_input_tokens is not None:
        head.append(Found("window", f"{where} max_input_tokens", price.max_input_tokens))
    if price.max_output_tokens is not None:
        head.append(Found("output", f"{where} max_output_tokens", price.max_output_tokens))
    elif price.max_tokens is not None:
        head.append(Found("output", f"{where} max_tokens (legacy: the output limit)", price.max_tokens))
    return _rebase(capacity, head)


def override(
    capacity: Capacity, *, context_window: int | None = None, max_output_tokens: int | None = None
) -> Capacity:
    """The capacity with the caller's flags put first."""
    head = []
    if context_window is not None:
        head.append(Found("window", "--context-window", context_window))
    if max_output_tokens is not None:
        head.append(Found("output", "--max-output-tokens", max_output_tokens))
    return _rebase(capacity, head)


def _rebase(capacity: Capacity, head: list[Found]) -> Capacity:
    if not head:
        return capacity
    kept = [n for n in capacity.notes if " differs from " not in n]  # conflicts are said again against the new head
    return _decide((*head, *capacity.found), tuple(kept))


__all__ = ["LARGE_INTEGER", "UNKNOWN", "WINDOW_KEYS", "Capacity", "Found", "from_files", "override", "with_price"]
