"""The deterministic sampler: every processor against a hand-computed numpy reference, the composed pipeline
against transformers' own logits processors, determinism across runs and processes, and typed errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlock.errors import SamplerError
from ctxlock.generation._sampler import (
    DEFAULT_ORDER,
    LLAMA_CPP_ORDER,
    VLLM_ORDER,
    Sampler,
    SamplerConfig,
    apply_min_p,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    distribution,
)
from hypothesis_profiles import examples

NEG = -np.inf


def _logits(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n).astype(np.float32) * 3


# ------------------------------------------------------------------------------------------- processors


def test_repetition_penalty_by_hand() -> None:
    logits = np.array([2.0, -1.0, 0.5, 0.0, 3.0])
    out = apply_repetition_penalty(logits, np.array([0, 1, 3]), 2.0)
    np.testing.assert_array_equal(out, [1.0, -2.0, 0.5, 0.0, 3.0])  # positive / p, negative * p, zero stays
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, 0.0, 3.0])  # input untouched
    # through distribution(): history ids are vocabulary ids, repeats count once
    cfg = SamplerConfig(repetition_penalty=2.0, temperature=0.0)
    ids, probs = distribution(cfg, np.array([3.0, 2.9, 1.0]), history=[0, 0, 0])
    assert ids.tolist() == [1] and probs.tolist() == [1.0]  # 3.0 / 2 = 1.5 < 2.9


def test_temperature_by_hand() -> None:
    np.testing.assert_allclose(apply_temperature(np.array([1.0, -2.0, 4.0]), 0.5), [2.0, -4.0, 8.0])
    _, probs = distribution(SamplerConfig(temperature=2.0), np.array([0.0, np.log(4.0)], dtype=np.float64))
    np.testing.assert_allclose(probs, [1 / 3, 2 / 3])  # softmax([0, log 4] / 2) = softmax([0, log 2])


def test_top_k_by_hand_keeps_ties_at_the_kth_value() -> None:
    logits = np.array([1.0, 3.0, 3.0, 2.0, 0.5])
    np.testing.assert_array_equal(apply_top_k(logits, 2), [NEG, 3.0, 3.0, NEG, NEG])
    np.testing.assert_array_equal(apply_top_k(logits, 1), [NEG, 3.0, 3.0, NEG, NEG])  # tie at the 1st value
    np.testing.assert_array_equal(apply_top_k(logits, 3), [NEG, 3.0, 3.0, 2.0, NEG])
    np.testing.assert_array_equal(apply_top_k(logits, 0), logits)
    np.testing.assert_array_equal(apply_top_k(logits, 99), logits)


def test_top_p_by_hand() -> None:
    probs = np.array([0.05, 0.5, 0.15, 0.3])  # by id; sorted: 0.5 (1), 0.3 (3), 0.15 (2), 0.05 (0)
    logits = np.log(probs)
    keep = lambda p: np.flatnonzero(np.isfinite(apply_top_p(logits, p))).tolist()  # noqa: E731
    assert keep(0.4) == [1]  # 0.5 already reaches 0.4
    assert keep(0.75) == [1, 3]  # 0.5 + 0.3 = 0.8 >= 0.75
    assert keep(0.9) == [1, 2, 3]  # 0.95
    assert keep(0.99) == [0, 1, 2, 3]
    assert keep(1.0) == [0, 1, 2, 3]
    kept = apply_top_p(logits, 0.75)
    np.testing.assert_array_equal(kept[[1, 3]], logits[[1, 3]])  # survivors keep their logits


def test_top_p_ties_break_toward_the_lower_id() -> None:
    logits = np.zeros(4)  # four equal tokens: the 0.5 nucleus is the two lowest ids
    assert np.flatnonzero(np.isfinite(apply_top_p(logits, 0.5))).tolist() == [0, 1]


def test_min_p_by_hand() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)
    keep = lambda m: np.flatnonzero(np.isfinite(apply_min_p(logits, m))).tolist()  # noqa: E731
    assert keep(0.2) == [0, 1, 2]  # threshold 0.1
    assert keep(0.5) == [0, 1]  # threshold 0.25
    assert keep(0.0) == [0, 1, 2, 3]
    assert keep(1.0) == [0]


def test_processor_order_changes_the_kept_set() -> None:
    """top_p after a hot temperature keeps more tokens than before it: why the order is part of the config."""
    logits = np.log(np.array([0.6, 0.25, 0.1, 0.05]))
    before = SamplerConfig(temperature=3.0, top_p=0.8, order=("top_p", "temperature"))
    after = SamplerConfig(temperature=3.0, top_p=0.8, order=("temperature", "top_p"))
    assert distribution(before, logits)[0].tolist() == [0, 1]
    assert distribution(after, logits)[0].tolist() == [0, 1, 2]
    assert before.digest != after.digest


def _reference_probs(cfg: SamplerConfig, logits: np.ndarray, allowed, history) -> np.ndarray:
    """The whole step, written out with plain numpy over the full vocabulary (masked ids at -inf)."""
    x = logits.astype(np.float64).copy()
    if allowed is not None:
        x[~allowed] = -np.inf
    for name in cfg.order:
        if name == "repetition_penalty":
            for i in set(history):
                if np.isfinite(x[i]):
                    x[i] = x[i] / cfg.repetition_penalty if x[i] > 0 else x[i] * cfg.repetition_penalty
        elif name == "temperature":
            x = x / cfg.temperature
        elif name == "top_k" and cfg.top_k:
            finite = np.sort(x[np.isfinite(x)])[::-1]
            if cfg.top_k < finite.size:
                x[x < finite[cfg.top_k - 1]] = -np.inf
        elif name in ("top_p", "min_p"):
            p = np.exp(x - x.max())
            p /= p.sum()
            if name == "min_p" and cfg.min_p:
                x[p < cfg.min_p * p.max()] = -np.inf
            elif name == "top_p" and cfg.top_p < 1:
                order = sorted(range(x.size), key=lambda i: (-p[i], i))
                total, kept = 0.0, set()
                for i in order:
                    kept.add(i)
                    total += p[i]
                    if total >= cfg.top_p:
                        break
                x[[i for i in range(x.size) if i not in kept]] = -np.inf
    p = np.exp(x - x.max())
    return p / p.sum()


@settings(max_examples=examples(60), deadline=None)
@given(
    seed=st.integers(0, 2**16),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.8]),
    top_k=st.sampled_from([0, 1, 5, 40]),
    top_p=st.sampled_from([1.0, 0.95, 0.6, 0.2]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    penalty=st.sampled_from([1.0, 1.3, 0.8]),
    order=st.sampled_from([DEFAULT_ORDER, VLLM_ORDER, LLAMA_CPP_ORDER]),
    masked=st.booleans(),
)
def test_distribution_matches_the_numpy_reference(seed, temperature, top_k, top_p, min_p, penalty, order, masked):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=300).astype(np.float32) * 2
    allowed = rng.random(300) < 0.4 if masked else None
    if allowed is not None:
        allowed[rng.integers(300)] = True
    history = rng.integers(0, 300, size=20).tolist()
    cfg = SamplerConfig(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=penalty, order=order
    )
    ids, probs = distribution(cfg, logits, allowed=allowed, history=history)
    ref = _reference_probs(cfg, logits, allowed, history)
    full = np.zeros(300)
    full[ids] = probs
    np.testing.assert_allclose(full, ref, rtol=1e-9, atol=1e-12)
    assert ids.size >= 1 and np.all(np.diff(ids) > 0)
    if allowed is not None:
        assert allowed[ids].all()


def test_default_order_matches_transformers_processors() -> None:
    """The default pipeline is transformers' own: RepetitionPenalty, Temperature, TopK, TopP, MinP."""
    import torch
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    rng = np.random.default_rng(3)
    for trial in range(20):
        logits = (rng.normal(size=2000) * 2.5).astype(np.float64)
        history = rng.integers(0, 2000, size=50).tolist()
        cfg = SamplerConfig(
            temperature=[0.6, 1.3][trial % 2],
            top_k=[0, 50, 400][trial % 3],
            top_p=[1.0, 0.9, 0.5][trial % 3],
            min_p=[0.0, 0.05][trial % 2],
            repetition_penalty=1.2,
        )
        procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(cfg.temperature)])
        if cfg.top_k:
            procs.append(TopKLogitsWarper(cfg.top_k))
        if cfg.top_p < 1:
            procs.append(TopPLogitsWarper(cfg.top_p))
        if cfg.min_p:
            procs.append(MinPLogitsWarper(cfg.min_p))
        scores = procs(torch.tensor([history]), torch.tensor(logits[None, :]))
        ref = torch.softmax(scores, dim=-1)[0].numpy()
        ids, probs = distribution(cfg, logits, history=history)
        full = np.zeros(2000)
        full[ids] = probs
        np.testing.assert_allclose(full, ref, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------- sampling


def test_greedy_is_argmax_with_lowest_id_on_ties_and_draws_nothing() -> None:
    s = Sampler(temperature=0.0, seed=1)
    assert s.sample(np.array([0.0, 5.0, 5.0, 1.0], dtype=np.float32)) == 1
    assert s.sample(np.array([7.0, 7.0, 7.0])) == 0
    assert s.sample(np.array([7.0, 7.0, 7.0]), allowed=np.array([False, True, True])) == 1
    assert s.draws == 0


def test_inverse_cdf_draws_follow_the_distribution() -> None:
    s = Sampler(seed=123)
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    counts = np.bincount([s.sample(logits) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.012)
    assert s.draws == 20000


def test_masked_tokens_are_never_drawn() -> None:
    s = Sampler(seed=9)
    logits = _logits(500)
    allowed = np.zeros(500, dtype=bool)
    allowed[[3, 77, 499]] = True
    assert {s.sample(logits, allowed=allowed) for _ in range(300)} == {3, 77, 499}
    short = np.zeros(10, dtype=bool)
    short[4] = True  # ids past the end of a shorter mask are not allowed
    assert {s.sample(logits, allowed=short) for _ in range(20)} == {4}


def _sequence(seed: int, stream: int | None, steps: int = 200, **params) -> list[int]:
    s = Sampler(seed=seed, stream=stream, top_k=50, top_p=0.9, **params)
    rng = np.random.default_rng(1000 + seed)
    return [s.sample(rng.normal(size=5000).astype(np.float32)) for _ in range(steps)]


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    assert _sequence(7, None) == _sequence(7, None)
    assert _sequence(7, 3) == _sequence(7, 3)
    assert _sequence(7, None) != _sequence(8, None)
    assert _sequence(7, 0) != _sequence(7, 1)  # streams are independent


def test_same_seed_same_tokens_across_processes() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from ctxlock.generation._sampler import Sampler
        out = {}
        for seed, stream in [(7, None), (7, 3), (2**40, 0)]:
            s = Sampler(seed=seed, stream=stream, top_k=50, top_p=0.9)
            rng = np.random.default_rng(1000 + seed)
            out[f"{seed}/{stream}"] = [s.sample(rng.normal(size=5000).astype(np.float32)) for _ in range(200)]
        print(json.dumps(out))
        """
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True) for _ in range(2)]
    a, b = (json.loads(r.stdout) for r in runs)
    assert a == b
    assert a["7/None"] == _sequence(7, None) and a["7/3"] == _sequence(7, 3)
    assert a[f"{2**40}/0"] == _sequence(2**40, 0)


# ------------------------------------------------------------------------------------------- config


def test_config_dict_and_digest() -> None:
    cfg = SamplerConfig(temperature=0.7, top_k=40, seed=5)
    d = cfg.to_dict()
    assert d["order"] == ["repetition_penalty", "temperature", "top_k", "top_p", "min_p"]
    assert d["seed"] == 5 and d["algorithm"] == "ctxlock.sampler/1"
    assert SamplerConfig.from_dict(d) == cfg and SamplerConfig.from_dict(d).digest == cfg.digest
    assert len(cfg.digest) == 64 and cfg.digest == SamplerConfig(temperature=0.7, top_k=40, seed=5).digest
    assert cfg.digest != SamplerConfig(temperature=0.7, top_k=40, seed=6).digest
    assert cfg.digest != SamplerConfig(temperature=0.7, top_k=40, seed=5, order=VLLM_ORDER).digest
    s = Sampler(cfg, stream=2)
    assert s.to_dict()["order"] == d["order"] and s.to_dict()["digest"] == cfg.digest and s.to_dict()["stream"] == 2
    assert cfg.active == ("temperature", "top_k")
    with pytest.raises(SamplerError, match=r"ctxlock\.sampler/0"):
        SamplerConfig.from_dict({**d, "algorithm": "ctxlock.sampler/0"})
    with pytest.raises(SamplerError, match="unknown sampler option"):
        SamplerConfig.from_dict({**d, "typical_p": 0.5})


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"order": ("temperature", "typical_p")}, "order"),
        ({"order": ("temperature", "temperature")}, "order"),
        ({"top_k": 5, "order": ("temperature", "top_p")}, "order"),
    ],
)
def test_bad_parameters(params, path) -> None:
    with pytest.raises(SamplerError) as err:
        SamplerConfig(**params)
    assert err.value.path == path


def test_bad_logits_masks_and_history() -> None:
    s = Sampler(seed=0)
    good = _logits(10)
    for bad_value, index in ((np.nan, 4), (np.inf, 7), (-np.inf, 0)):
        x = good.copy()
        x[index] = bad_value
        with pytest.raises(SamplerError) as err:
            s.sample(x)
        assert err.value.path == f"logits[{index}]" and "not finite" in err.value.message
    with pytest.raises(SamplerError, match="float32 or float64"):
        s.sample(np.arange(10))
    with pytest.raises(SamplerError, match="1-D"):
        s.sample(good.reshape(2, 5))
    with pytest.raises(SamplerError, match="numpy array"):
        s.sample([0.1, 0.2])  # type: ignore[arg-type]
    with pytest.raises(SamplerError, match="allows no token"):
        s.sample(good, allowed=np.zeros(10, dtype=bool))
    with pytest.raises(SamplerError, match="covers 11 ids"):
        s.sample(good, allowed=np.ones(11, dtype=bool))
    with pytest.raises(SamplerError, match="bool array"):
        s.sample(good, allowed=np.ones(10, dtype=np.int32))
    with pytest.raises(SamplerError, match="history id 10"):
        s.sample(good, history=[1, 10])
    with pytest.raises(SamplerError, match="not both"):
        Sampler(SamplerConfig(), seed=3)
    assert s.draws == 0  # no failed call consumed randomness


@settings(max_examples=examples(50), deadline=None)
@given(seed=st.integers(0, 10**6), top_k=st.integers(0, 20), top_p=st.floats(0.01, 1.0), min_p=st.floats(0.0, 1.0))
def test_filters_never_remove_the_best_allowed_token(seed, top_k, top_p, min_p) -> None:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=64)
    allowed = rng.random(64) < 0.5
    allowed[rng.integers(64)] = True
    cfg = SamplerConfig(top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    ids, probs = distribution(cfg, logits, allowed=allowed)
    best = np.flatnonzero(allowed)[np.argmax(logits[allowed])]
    assert best in ids.tolist() and abs(probs.sum() - 1) < 1e-12
    assert Sampler(cfg).sample(logits, allowed=allowed) in ids.tolist()
