"""`ctxlock constrain`: sample JSON under a JSON-Schema token mask from seeded random logits, and check every
output against the schema.

There is no model here: each step's logits are i.i.d. uniform float32 in [-5, 5) over the whole vocabulary, drawn
from `numpy.random.default_rng([seed, sample])` (uniform rather than normal because numpy draws it about 8x
faster, and one 131K-vector per step is most of the run time; a spread of 10 makes the sampler's filters bite).
Nothing biases them toward EOS or structural tokens: what makes samples end is the grammar (bounded strings,
enums, maxItems) and `--max-tokens`. So the command exercises the mask and the sampler on a real vocabulary, and
the stop rate says how constraining the schema is.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ctxlock.artifacts import ModelArtifacts, load_artifacts
from ctxlock.cli.files import read_text
from ctxlock.cli.output import err_console
from ctxlock.cli.render import MODEL_HELP
from ctxlock.errors import ConstraintError, SamplerError
from ctxlock.generation._constrain import WHITESPACE_MODES, JsonSchemaMask
from ctxlock.generation._sampler import DEFAULT_ORDER, PROCESSORS, Sampler, SamplerConfig

LOGITS = (
    "i.i.d. uniform float32 in [-5, 5) for the ids the mask allows (in id order; 0 for the others, never sampled), "
    "one vector per step, numpy default_rng([seed, sample])"
)


@dataclass(frozen=True)
class ConstrainedSample:
    index: int
    ids: tuple[int, ...]
    text: str
    finish_reason: str  # "stop": EOS chosen or the grammar closed the value; "length": --max-tokens reached
    valid: bool  # only ever True for a "stop" sample that parses and validates
    error: str | None
    sample_seconds: tuple[float, ...]  # sampler time per step

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "tokens": len(self.ids),
            "complete": self.finish_reason == "stop",
            "valid": self.valid,
        }
        if self.error:
            out["error"] = self.error
        return out


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_output(text: str, validator: Any) -> str | None:
    """None when `text` is one JSON value (no duplicate keys, no NaN) that validates; else why not."""
    try:
        value = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except ValueError as exc:
        return f"not JSON: {exc}"
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return None
    where = "$" + "".join(f"[{k!r}]" for k in error.absolute_path)
    return f"{where}: {error.message}"


def random_logits(rng: np.random.Generator, allowed: np.ndarray) -> np.ndarray:
    """One step's stand-in for a model: i.i.d. uniform float32 in [-5, 5) for each id the mask allows (drawn in id
    order), 0 for the others, which the sampler never takes (`allowed=`). Drawing only the allowed ids gives the
    same distribution over the next token as drawing the whole vocabulary, at a fraction of the cost on a 131K
    vocabulary whose mask allows a few ids."""
    ids = np.flatnonzero(allowed)
    logits = np.zeros(allowed.size, dtype=np.float32)
    drawn = rng.random(ids.size, dtype=np.float32)
    drawn *= 10
    drawn -= 5
    logits[ids] = drawn
    return logits


def generate(
    mask: JsonSchemaMask, config: SamplerConfig, *, samples: int, seed: int, max_tokens: int, validator: Any
) -> Iterator[ConstrainedSample]:
    """Sample `samples` outputs under `mask`. Sample i: logits from default_rng([seed, i]) (`random_logits`),
    sampler stream i.

    Each step samples one token (EOS included, as max_tokens counts it in vLLM); the sample stops when EOS is
    drawn or when the token just consumed closed the value (`is_stopped`: only EOS could follow)."""
    decode = mask.tokenizer.decode
    for i in range(samples):
        mask.reset()
        logits_rng = np.random.default_rng([seed, i])
        sampler = Sampler(config, stream=i)
        ids: list[int] = []
        times: list[float] = []
        finish = "length"
        for _ in range(max_tokens):
            allowed = mask.mask()
            logits = random_logits(logits_rng, allowed)
            t0 = time.perf_counter()
            token = sampler.sample(logits, allowed=allowed, history=ids)
            times.append(time.perf_counter() - t0)
            mask.consume(token)
            if token == mask.eos_id:
                finish = "stop"
                break
            ids.append(token)
            if mask.is_stopped():
                finish = "stop"
                break
        text = decode(ids, skip_special_tokens=False)
        if finish == "stop":
            error = check_output(text, validator)
            valid = error is None
        else:
            error, valid = None, False  # cut off: incomplete, never reported as valid
        yield ConstrainedSample(i, tuple(ids), text, finish, valid, error, tuple(times))


def _parse_order(order: str | None) -> tuple[str, ...]:
    if order is None:
        return DEFAULT_ORDER
    names = tuple(n.strip() for n in order.split(",") if n.strip())
    return names


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 4)


SchemaOpt = Annotated[Path, typer.Option("--schema", "-s", help="JSON Schema file the outputs must validate against.")]
ConstrainModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help=MODEL_HELP + " Default: the embedded mistral-nemo (Tekken, 131K vocabulary).",
    ),
]
SamplesOpt = Annotated[int, typer.Option("--samples", "-n", min=1, help="How many outputs to sample.")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="Seeds the logits and the sampler.")]
MaxTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-tokens",
        min=1,
        help="Tokens per sample, EOS included. A sample cut here is 'length': incomplete, never valid.",
    ),
]
TemperatureOpt = Annotated[float, typer.Option(help="Sampler temperature; 0 = greedy (lowest id on ties).")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off.")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus mass to keep; 1 = off.")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Keep p >= min_p * p_max; 0 = off.")]
RepetitionPenaltyOpt = Annotated[
    float, typer.Option("--repetition-penalty", help="CTRL penalty on ids already sampled; 1 = off.")
]
OrderOpt = Annotated[
    str | None,
    typer.Option(
        "--order",
        help=f"Processor order, comma-separated (default: {','.join(DEFAULT_ORDER)}, transformers' order; "
        f"known: {', '.join(PROCESSORS)}).",
    ),
]
WhitespaceOpt = Annotated[
    str,
    typer.Option(
        "--whitespace",
        help="compact: one canonical spelling, no layout tokens (default); flexible: any JSON whitespace "
        "(with random logits, whitespace runs make samples long).",
    ),
]
EosOpt = Annotated[
    str | None, typer.Option("--eos", help="End-of-sequence token string (default: the model's eos_token).")
]


def register(app: typer.Typer) -> None:
    app.command()(constrain)


def constrain(
    schema: SchemaOpt,
    model: ConstrainModelOpt = None,
    samples: SamplesOpt = 10,
    seed: SeedOpt = 0,
    max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 1.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    min_p: MinPOpt = 0.0,
    repetition_penalty: RepetitionPenaltyOpt = 1.0,
    order: OrderOpt = None,
    whitespace: WhitespaceOpt = "compact",
    eos: EosOpt = None,
) -> None:
    """Sample JSON under a JSON-Schema token mask (llguidance over ctxlock's own tokenizer) from seeded random
    logits, and validate every output with jsonschema.

    Prints one JSON line per sample: {"index", "text", "finish_reason", "tokens", "complete", "valid"}, then a
    {"summary": ...} line with the sampler config (processor order, digest), the counts and the timings
    (compile, mask median/p99 per token). Exits 1 if a completed sample does not validate."""
    import jsonschema  # a third-party import only this command needs

    if whitespace not in WHITESPACE_MODES:
        raise typer.BadParameter(f"use one of {', '.join(WHITESPACE_MODES)}", param_hint="--whitespace")
    try:
        config = SamplerConfig(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            order=_parse_order(order),
        )
    except SamplerError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{(exc.path or 'order').replace('_', '-')}") from None
    schema_text = read_text(schema, option="--schema")
    arts = load_artifacts(model)
    mask = _schema_mask(arts, schema_text, eos, whitespace, source=str(schema))
    validator_cls = jsonschema.validators.validator_for(mask.schema)
    validator = validator_cls(mask.schema, format_checker=validator_cls.FORMAT_CHECKER)
    run = _Run.sample(mask, config, samples=samples, seed=seed, max_tokens=max_tokens, validator=validator)
    stats = mask.stats()
    settings = {
        "schema": str(schema),
        "schema_sha256": mask.schema_sha256,
        "whitespace": whitespace,
        "samples": samples,
        "seed": seed,
        "max_tokens": max_tokens,
    }
    summary = _summary(arts, mask, config, settings, run, stats)
    sys.stdout.write(json.dumps({"summary": summary}, ensure_ascii=False) + "\n")
    err_console.print(
        f"{samples} samples: {run.counts['stop']} stop ({run.valid} valid), {run.counts['length']} length; "
        f"compile {stats.compile_seconds * 1000:.2f} ms (vocabulary {stats.tokenizer_seconds:.2f} s"
        f"{', cached' if stats.tokenizer_cached else ''}); mask median {stats.mask_median_seconds * 1000:.3f} ms, "
        f"p99 {stats.mask_p99_seconds * 1000:.3f} ms per token; sampler order {','.join(config.order)}",
        soft_wrap=True,
    )
    if run.invalid:
        err_console.print(f"[red]{run.invalid} completed sample(s) do not validate against the schema[/]")
        raise typer.Exit(1)


def _schema_mask(
    arts: ModelArtifacts, schema_text: str, eos: str | None, whitespace: str, *, source: str
) -> JsonSchemaMask:
    """The schema's token mask over the model's tokenizer, ending at --eos (default: the model's eos_token)."""
    tokenizer = arts.tokenizer
    eos_id = None
    if eos is not None:
        eos_id = tokenizer.token_to_id(eos)
        if eos_id is None:
            raise ConstraintError(f"{eos!r} is not a token of this vocabulary", path="--eos")
    return JsonSchemaMask(
        tokenizer,
        schema_text,
        eos_id=eos_id,
        special_tokens=arts.special_tokens,
        whitespace=whitespace,
        source=source,
    )


@dataclass
class _Run:
    """The samples of one `constrain` run, as printed (one JSON line each), counted."""

    counts: dict[str, int]
    valid: int
    invalid: int
    lengths: list[int]
    sample_times: list[float]
    wall: float

    @classmethod
    def sample(
        cls, mask: JsonSchemaMask, config: SamplerConfig, *, samples: int, seed: int, max_tokens: int, validator: Any
    ) -> _Run:
        """Sample and print each result as it comes (one JSON line, flushed)."""
        t0 = time.perf_counter()
        run = cls({"stop": 0, "length": 0}, 0, 0, [], [], 0.0)
        out = sys.stdout
        for result in generate(mask, config, samples=samples, seed=seed, max_tokens=max_tokens, validator=validator):
            run.counts[result.finish_reason] += 1
            run.valid += result.valid
            run.invalid += result.finish_reason == "stop" and not result.valid
            run.lengths.append(len(result.ids))
            run.sample_times.extend(result.sample_seconds)
            out.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
            out.flush()
        run.wall = time.perf_counter() - t0
        return run


def _summary(
    arts: ModelArtifacts, mask: JsonSchemaMask, config: SamplerConfig, settings: dict[str, Any], run: _Run, stats: Any
) -> dict[str, Any]:
    """The {"summary": ...} line: the model, the settings, the sampler, the counts and the timings."""
    tokenizer = arts.tokenizer
    lengths, sample_times = run.lengths, run.sample_times
    return {
        "model": arts.id,
        "tokenizer": {
            "id": tokenizer.id,
            "format": tokenizer.format,
            "sha256": tokenizer.sha256,
            "vocab_size": mask.vocab_size,
        },
        "eos_id": mask.eos_id,
        **settings,
        "logits": LOGITS,
        "sampler": {**config.to_dict(), "digest": config.digest, "stream": "the sample index"},
        "finish_reason": run.counts,
        "valid": run.valid,
        "invalid_stops": run.invalid,
        "tokens": {"total": sum(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "timings": {
            "tokenizer_seconds": round(stats.tokenizer_seconds, 6),
            "tokenizer_cached": stats.tokenizer_cached,
            "compile_seconds": round(stats.compile_seconds, 6),
            "mask_calls": stats.mask_calls,
            "mask_median_ms": _ms(stats.mask_median_seconds),
            "mask_p99_ms": _ms(stats.mask_p99_seconds),
            "mask_max_ms": _ms(stats.mask_max_seconds),
            "sample_median_ms": _ms(statistics.median(sample_times)) if sample_times else 0.0,
            "wall_seconds": round(run.wall, 3),
        },
    }
