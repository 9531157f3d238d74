"""Timing shared by the benchmarks: medians, because these machines are noisy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], object], rounds: int, *, warmup: bool = False) -> float:
    """The median wall time of `rounds` calls of fn, after one untimed call when `warmup`."""
    if warmup:
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def side_by_side(vocab: str, template_file: str, *, load: str = "dir") -> tuple[Any, Any, Any, str]:
    """(ctxlock model, ChatTemplate, transformers tokenizer, template source) on the same artifacts: the vocabulary
    as transformers converts llama.cpp's GGUF, and a chat template file, both fetched by scripts/fetch_artifacts.py.
    The model is warmed up as a server would be at start-up (`Model.warm_up`: the engine check, fastokens built and
    checked), so no timed round pays for it. `load="gguf"`: ctxlock loads llama.cpp's GGUF file itself (another
    loader, the same vocabulary), transformers still its conversion."""
    import ctxlock
    import fetched
    import reference
    from ctxlock.template._render import ChatTemplate

    tok_dir = fetched.hf_tokenizer_dir(vocab)
    source = (fetched.templates_dir() / template_file).read_text("utf-8")
    model = ctxlock.load(str(fetched.gguf_path(vocab) if load == "gguf" else tok_dir))
    model.warm_up()
    return model, ChatTemplate(source, id=template_file), reference.reference_tokenizer(tok_dir), source
