"""A deterministic sampler over numpy logits: the same config, seed and logits give the same token, every run,
in every process (docs/way-back.md).

The config is a frozen value (`SamplerConfig`) whose canonical JSON and sha256 go into an execution record. It
includes the **processor order**, because the order changes the result (top-p after temperature keeps a different
set than before it) and the engines disagree:

| engine | order |
|---|---|
| transformers (`GenerationMixin._get_logits_processor`) | repetition penalty, temperature, top-k, top-p, min-p |
| vLLM v1 (`Sampler.forward`) | repetition penalty, temperature, min-p, top-k, top-p |
| llama.cpp (`common_sampler` default chain) | penalties, top-k, top-p, min-p, ..., temperature last |

The default is transformers' order, the reference the rest of ctxlock is checked against; pass `order=` to follow
vLLM or llama.cpp. A processor whose parameter is set must appear in the order (it is never skipped silently).

Semantics of one step, `Sampler.sample(logits, allowed=..., history=...)`:
1. `allowed` (a bool mask, e.g. `JsonSchemaMask.mask()`) is applied first: everything below runs over the allowed
   ids only (ids past the end of a shorter mask are not allowed, as with llguidance's bitmask);
2. the processors run in `order`, each turning logits into logits (a removed token becomes -inf):
   - `repetition_penalty` p (CTRL, as transformers and vLLM): for each id in `history`, a logit > 0 is divided
     by p, any other is multiplied by p;
   - `temperature` T: logits / T;
   - `top_k` k: keep the logits >= the k-th largest (ties at the k-th value are all kept, as transformers does);
   - `top_p` p: keep the smallest prefix of ids, by probability descending (ties: lower id first), whose mass
     reaches p (transformers' rule `cumulative <= 1 - p` removed, written from the top);
   - `min_p` m: keep the ids whose probability is >= m * the largest probability;
3. temperature 0 is greedy: the other processors run in order, then the argmax, ties to the **lowest id**, and
   no random draw (filters never remove the best token, so with the default order this is the argmax of the
   penalized logits);
4. otherwise one float64 `u = rng.random()` from a PCG64 generator seeded with `seed` picks the id whose
   cumulative probability interval (ids ascending) contains u: inverse-CDF sampling, sequential cumsum, so the
   result does not depend on thread count or BLAS.

Logits must be finite float32/float64 and 1-D: a NaN or inf is a `SamplerError` naming its index (mask with
`allowed=`, never with -inf). Everything is computed in float64.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxlock.errors import SamplerError

__all__ = [
    "DEFAULT_ORDER",
    "PROCESSORS",
    "Sampler",
    "SamplerConfig",
    "apply_min_p",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "distribution",
]

ALGORITHM = "ctxlock.sampler/1"  # bump when the arithmetic of a step changes: it is part of the digest
PROCESSORS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
DEFAULT_ORDER = PROCESSORS  # transformers' order
VLLM_ORDER = ("repetition_penalty", "temperature", "min_p", "top_k", "top_p")
LLAMA_CPP_ORDER = ("repetition_penalty", "top_k", "top_p", "min_p", "temperature")


# ------------------------------------------------------------------------------------------------ processors
# Each takes float64 logits (-inf = removed) and returns a new array; none of them ever removes the best token.


def _softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max()
    e = np.exp(logits - top)  # exp(-inf) = 0 for removed tokens
    return e / e.sum()


def apply_repetition_penalty(logits: np.ndarray, positions: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL's penalty at `positions` (indices into `logits`, each once): positive logits / p, others * p."""
    out = logits.copy()
    if penalty == 1.0 or positions.size == 0:
        return out
    v = out[positions]
    out[positions] = np.where(v > 0, v / penalty, v * penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    return logits / temperature


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the logits >= the k-th largest value; 0 or k >= n keeps all."""
    if k <= 0 or k >= logits.size:
        return logits.copy()
    kth = np.partition(logits, logits.size - k)[logits.size - k]
    return np.where(logits >= kth, logits, -np.inf)


def _descending(logits: np.ndarray) -> np.ndarray:
    """Indices by logit descending, ties by index ascending (a stable sort of the negated logits)."""
    return np.argsort(-logits, kind="stable")


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the shortest run of most probable tokens whose probability mass reaches p (at least one)."""
    if p >= 1.0:
        return logits.copy()
    order = _descending(logits)
    cumulative = np.cumsum(_softmax(logits)[order])
    keep = min(int(np.searchsorted(cumulative, p, side="left")) + 1, logits.size)
    out = np.full_like(logits, -np.inf)
    out[order[:keep]] = logits[order[:keep]]
    return out


def apply_min_p(logits: np.ndarray, m: float) -> np.ndarray:
    """Keep the tokens whose probability is at least m times the top probability."""
    if m <= 0.0:
        return logits.copy()
    probs = _softmax(logits)
    return np.where(probs >= m * probs.max(), logits, -np.inf)


# ------------------------------------------------------------------------------------------------ config


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise SamplerError(f"{name} must be a number, got {value!r}", path=name)
    value = float(value)
    if not math.isfinite(value):
        raise SamplerError(f"{name} must be finite, got {value!r}", path=name)
    return value


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that decides a sampled token, besides the logits and the mask. Defaults change nothing
    (temperature 1, every filter off)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    seed: int = 0
    order: tuple[str, ...] = field(default=DEFAULT_ORDER)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "temperature", _number("temperature", self.temperature))
        if self.temperature < 0:
            raise SamplerError(
                f"temperature must be >= 0, got {self.temperature}", path="temperature", hint="0 means greedy"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int | np.integer) or self.top_k < 0:
            raise SamplerError(f"top_k must be an integer >= 0, got {self.top_k!r}", path="top_k", hint="0 is off")
        set_(self, "top_k", int(self.top_k))
        set_(self, "top_p", _number("top_p", self.top_p))
        if not 0.0 < self.top_p <= 1.0:
            raise SamplerError(f"top_p must be in (0, 1], got {self.top_p}", path="top_p", hint="1 is off")
        set_(self, "min_p", _number("min_p", self.min_p))
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplerError(f"min_p must be in [0, 1], got {self.min_p}", path="min_p", hint="0 is off")
        set_(self, "repetition_penalty", _number("repetition_penalty", self.repetition_penalty))
        if self.repetition_penalty <= 0:
            raise SamplerError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
                path="repetition_penalty",
                hint="1 is off; > 1 discourages repeats",
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer) or self.seed < 0:
            raise SamplerError(f"seed must be an integer >= 0, got {self.seed!r}", path="seed")
        set_(self, "seed", int(self.seed))
        if not isinstance(self.order, str | list | tuple):
            raise SamplerError(
                f"order must be an array of processor names, got {self.order!r:.40}",
                path="order",
                hint=f"for example {list(DEFAULT_ORDER)}",
            )
        order = (self.order,) if isinstance(self.order, str) else tuple(self.order)
        for name in order:
            if name not in PROCESSORS:
                raise SamplerError(
                    f"unknown processor {name!r} in order", path="order", hint=f"known: {', '.join(PROCESSORS)}"
                )
        if len(set(order)) != len(order):
            raise SamplerError(f"a processor appears twice in order {list(order)}", path="order")
        missing = [n for n in self.active if n not in order]
        if missing:
            raise SamplerError(
                f"{', '.join(missing)} is set but not in the processor order {list(order)}",
                path="order",
                hint="add it to order, or leave its parameter at the off value",
            )
        set_(self, "order", order)

    @property
    def active(self) -> tuple[str, ...]:
        """The processors that change anything, in PROCESSORS order."""
        on = {
            "repetition_penalty": self.repetition_penalty != 1.0,
            "temperature": self.temperature not in (0.0, 1.0),
            "top_k": self.top_k > 0,
            "top_p": self.top_p < 1.0,
            "min_p": self.min_p > 0.0,
        }
        return tuple(n for n in PROCESSORS if on[n])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": ALGORITHM,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "order": list(self.order),
            "generator": "numpy PCG64(SeedSequence(seed))",
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplerConfig:
        if not isinstance(data, Mapping):
            raise SamplerError("a sampler config is a JSON object")
        known = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "order"}
        algorithm = data.get("algorithm", ALGORITHM)
        if algorithm != ALGORITHM:
            raise SamplerError(
                f"this sampler implements {ALGORITHM!r}, the config is for {algorithm!r}",
                path="algorithm",
                hint="replay with the ctxlock version that recorded it",
            )
        unknown = sorted(set(data) - known - {"algorithm", "generator"})
        if unknown:
            raise SamplerError(f"unknown sampler option(s) {unknown}", path=unknown[0], hint=f"known: {sorted(known)}")
        return cls(**{k: v for k, v in data.items() if k in known})

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON: identifies the sampling procedure in an execution record."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------------------ sampling


def _check_logits(logits: Any) -> np.ndarray:
    if not isinstance(logits, np.ndarray):
        raise SamplerError(f"logits must be a numpy array, got {type(logits).__name__}", path="logits")
    if logits.ndim != 1:
        raise SamplerError(f"logits must be 1-D (one row of the vocabulary), got shape {logits.shape}", path="logits")
    if logits.dtype not in (np.float32, np.float64):
        raise SamplerError(f"logits must be float32 or float64, got {logits.dtype}", path="logits")
    if logits.size == 0:
        raise SamplerError("logits are empty", path="logits")
    finite = np.isfinite(logits)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise SamplerError(
            f"logit {bad} is {logits[bad]!r}; {int((~finite).sum())} logits are not finite",
            path=f"logits[{bad}]",
            hint="a NaN or inf logit means the model output is broken; to exclude tokens pass allowed=",
        )
    return logits


def _allowed_ids(allowed: Any, n: int) -> np.ndarray:
    if allowed is None:
        return np.arange(n)
    if not isinstance(allowed, np.ndarray) or allowed.dtype != np.bool_ or allowed.ndim != 1:
        raise SamplerError("allowed must be a 1-D numpy bool array (e.g. JsonSchemaMask.mask())", path="allowed")
    if allowed.size > n:
        raise SamplerError(f"the mask covers {allowed.size} ids but there are {n} logits", path="allowed")
    ids = np.flatnonzero(allowed)
    if ids.size == 0:
        raise SamplerError("the mask allows no token", path="allowed", hint="a mask must allow at least one id")
    return ids


def _check_history(history: Iterable[int], n: int) -> np.ndarray:
    seen = np.asarray(list(history), dtype=np.int64)
    if seen.size and (seen.min() < 0 or seen.max() >= n):
        bad = int(seen[(seen < 0) | (seen >= n)][0])
        raise SamplerError(f"history id {bad} is outside the vocabulary (0..{n - 1})", path="history")
    return seen


def distribution(
    config: SamplerConfig, logits: np.ndarray, *, allowed: np.ndarray | None = None, history: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """(ids ascending, probabilities) of the next token: what `Sampler.sample` draws from. Greedy configs give
    the single argmax with probability 1."""
    logits = _check_logits(logits)
    ids = _allowed_ids(allowed, logits.size)
    seen = _check_history(history, logits.size)
    values = logits[ids].astype(np.float64)
    for name in config.order:
        if name == "repetition_penalty":
            if config.repetition_penalty != 1.0 and seen.size:
                positions = np.flatnonzero(np.isin(ids, seen))
                values = apply_repetition_penalty(values, positions, config.repetition_penalty)
        elif name == "temperature":
            if not config.greedy:
                values = apply_temperature(values, config.temperature)
        elif name == "top_k":
            values = apply_top_k(values, config.top_k)
        elif name == "top_p":
            values = apply_top_p(values, config.top_p)
        elif name == "min_p":
            values = apply_min_p(values, config.min_p)
    if config.greedy:
        best = int(np.argmax(values))  # the first maximum = the lowest id, since ids ascend
        return ids[best : best + 1], np.ones(1)
    probs = _softmax(values)
    keep = probs > 0
    return ids[keep], probs[keep]


class Sampler:
    """Draws token ids under a `SamplerConfig`, from a PCG64 generator seeded with `config.seed`.

    `stream` selects an independent generator for the same seed (numpy's `SeedSequence(seed, spawn_key=(stream,))`,
    what `SeedSequence(seed).spawn()` would give): one per sample of a batch, each reproducible on its own.
    """

    def __init__(self, config: SamplerConfig | None = None, *, stream: int | None = None, **params: Any) -> None:
        if config is not None and params:
            raise SamplerError("pass a SamplerConfig or keyword parameters, not both")
        self.config = config if config is not None else SamplerConfig(**params)
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0):
            raise SamplerError(f"stream must be an integer >= 0, got {stream!r}", path="stream")
        self.stream = stream
        seq = (
            np.random.SeedSequence(self.config.seed)
            if stream is None
            else np.random.SeedSequence(self.config.seed, spawn_key=(stream,))
        )
        self._rng = np.random.Generator(np.random.PCG64(seq))
        self.draws = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.config.to_dict(), "stream": self.stream, "digest": self.config.digest}

    def sample(self, logits: np.ndarray, *, allowed: np.ndarray | None = None, history: Sequence[int] = ()) -> int:
        """One token id. `history` holds the ids the repetition penalty applies to (prompt + output so far)."""
        ids, probs = distribution(self.config, logits, allowed=allowed, history=history)
        if self.config.greedy:
            return int(ids[0])
        u = self._rng.random()
        self.draws += 1
        cdf = np.cumsum(probs)
        k = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return int(ids[min(k, ids.size - 1)])
