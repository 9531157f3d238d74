"""fastokens as the native call of whole-text encoding, admitted only after it agrees with tiktoken on the vocabulary.

`prefix.WholeText` encodes a rendered text in one native call. tiktoken makes that call where `fastbpe.check`
proved rank-based BPE equal to the vocabulary's merge-list BPE (and `whole_text_refusal` found the added tokens
plain). Under those same conditions the `tokenizer.json` pipeline is: an optional NFC normalizer (inert text only
reaches the native call), the added tokens matched on raw text, one split regex, byte-level mapping and BPE whose
merges are rank-consistent. fastokens (a native reimplementation of `tokenizers`, with the split regex on PCRE2's
JIT and a pre-token cache) runs that pipeline from the same `tokenizer.json`, about ten times faster than tiktoken
on chat text. Nothing in its construction proves it equal, so it is admitted by checking, not assumed:

1. it is built from the exact `tokenizer.json` bytes the tokenizer was loaded from, on a daemon thread started by
   the first whole-text encode (loading a 150k vocabulary takes about 1.4 s, with the GIL released); until it is
   ready, and whenever it is refused, tiktoken makes the call, with identical ids. `Model.warm_up()` builds it and
   waits, as a server would at start-up; describing a tokenizer (records, `ctxlock render`) never starts it;
2. before it is used, its ids must equal tiktoken's on probe texts that hold every token of the vocabulary that is
   valid UTF-8, every added token between and next to text, and whitespace, digit, case and script mixtures
   (`probe_texts`); one difference refuses it, and the reason names the probe and the token;
3. any exception from a call (a PCRE2 resource limit on a pathological text, say) sends that text to tiktoken.

The test suite then compares both engines with `tokenizers` on llama.cpp's vectors and on hypothesis texts for every
vocabulary where whole-text encoding is taken (`tests/test_prefix.py`).

`CTXLOCK_FASTOKENS=0` keeps tiktoken; `CTXLOCK_FASTOKENS=sync` builds and checks it in the calling thread, on first
use (deterministic, for tests).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

# Whitespace, digits, case, contractions, scripts and symbols around which split regexes differ most.
_MIXED = (
    "Hello world! HELLO World's 'S 'll 'VE i'm   spaces\t\ttabs\n\n\nnewlines \r\n crlf  \n  x\u00a0nbsp"
    " 1 12 123 1234 12345 3.14159 1,000,000 0x1F -42 ９８ ٣٤ 𝟙𝟚 "
    "def f(x):\n    return x ** 2  # comment\n\tif (a && b || !c) { y[i] += 1; }\n"
    "天空为什么是蓝色 東京タワー 한국어 текст Ελληνικά עברית العربية हिन्दी ไทย "
    "😀🚀 👩‍👩‍👧‍👦 🇯🇵 ✨ é e\u0301 ﬁ Å ß ẞ ǅ   \u200b\u2028\u3000"
)


def setting() -> str:
    """`CTXLOCK_FASTOKENS`: "1" (default: the first encode starts the build on a daemon thread), "0" (never), "sync"
    (the first encode builds it, in the calling thread)."""
    value = os.environ.get("CTXLOCK_FASTOKENS", "1").strip().lower()
    return value if value in ("0", "sync") else "1"


def fastokens_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("fastokens")
    except Exception:
        return None


def probe_texts(ranks: Mapping[bytes, int], added: Mapping[str, int], *, chunk: int = 1500) -> Iterator[str]:
    """The texts both engines must agree on: every UTF-8 token of the vocabulary (in rank order, `chunk` to a text,
    glued so that neighbours pre-tokenize and merge together, and again separated by spaces), every added token
    alone, between text and next to another, and a mixture of scripts, digits and whitespace."""
    tokens = [t for t, _ in sorted(ranks.items(), key=lambda kv: kv[1])]
    words: list[str] = []
    for raw in tokens:
        try:
            words.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    for i in range(0, len(words), chunk):
        part = words[i : i + chunk]
        yield "".join(part)
        yield " ".join(part)
    yield _MIXED
    specials = sorted(added)
    if specials:
        yield "".join(f"{s}x{s} {s}\n" for s in specials)
        yield "".join(f"a{s}{t}b" for s, t in zip(specials, reversed(specials), strict=True))
        yield _MIXED.join(specials[:64])


class Accelerator:
    """A fastokens tokenizer for one vocabulary, built and checked once; `encode` gives None until it is admitted."""

    def __init__(
        self,
        build: Callable[[], Any],
        reference: Callable[[str], np.ndarray | None],
        probes: Callable[[], Iterator[str]],
    ) -> None:
        """`build()`: the fastokens tokenizer; `reference(text)`: the exact ids (uint32) for a text, None to skip
        it; `probes()`: the texts to compare them on."""
        self._build = build
        self._reference = reference
        self._probes = probes
        self._engine: Any = None
        self._done = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self.state = "not started"  # "building" | "ready" | "refused" | "off"
        self.reason = ""
        self.failures = 0  # calls that raised and went to tiktoken
        if setting() == "0":
            self._finish("off", "CTXLOCK_FASTOKENS=0")

    def _finish(self, state: str, reason: str, engine: Any = None) -> None:
        self.state, self.reason = state, reason
        self._engine = engine  # last: `ready` never says yes before `state` does
        self._started = True
        self._done.set()

    def _claim(self) -> bool:
        """Mark the build as started; True for the one caller that must run it."""
        with self._lock:
            if self._started:
                return False
            self._started = True
            self.state = "building"
            return True

    def start(self) -> None:
        """Build and check on a daemon thread, once (the first `encode` does this by default)."""
        if self._claim():
            threading.Thread(target=self._run, name="ctxlock-fastokens", daemon=True).start()

    def _run(self) -> None:
        try:
            engine = self._build()
        except ImportError:
            self._finish("refused", "fastokens is not installed")
            return
        except Exception as exc:  # a tokenizer.json it cannot load
            self._finish("refused", f"fastokens could not load the tokenizer.json: {exc}")
            return
        checked = ids = 0
        try:
            for n, text in enumerate(self._probes()):
                expected = self._reference(text)
                if expected is None:
                    continue
                got = _ids(engine, text)
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    n_common = min(len(got), len(expected))
                    k = int(np.argmax(got[:n_common] != expected[:n_common])) if n_common else 0
                    self._finish(
                        "refused",
                        f"fastokens differs from the exact path on probe text {n} at token {k} "
                        f"({len(got)} ids against {len(expected)})",
                    )
                    return
                checked += 1
                ids += len(expected)
        except Exception as exc:
            self._finish("refused", f"fastokens failed on a probe text: {exc}")
            return
        version = fastokens_version() or "?"
        self._finish("ready", f"{version}, ids equal to the exact path on {checked} probe texts ({ids:,} ids)", engine)

    def wait(self, timeout: float | None = None) -> bool:
        """Build and check now if nothing has started them, else wait for them; True when admitted."""
        if self._claim():
            self._run()
        self._done.wait(timeout)
        return self._engine is not None

    @property
    def ready(self) -> bool:
        return self._engine is not None

    def encode(self, text: str) -> np.ndarray | None:
        """fastokens' ids for `text` (uint32), or None: not admitted (yet), or the call failed. The first call starts
        the build: on a daemon thread (returning None meanwhile), or here under CTXLOCK_FASTOKENS=sync."""
        engine = self._engine
        if engine is None:
            if self._started:
                return None
            if setting() != "sync":
                self.start()
                return None
            self.wait()
            engine = self._engine
            if engine is None:
                return None
        try:
            return _ids(engine, text)
        except Exception:
            self.failures += 1
            return None

    def describe(self) -> str:
        return f"{self.state}: {self.reason}" if self.reason else self.state


def _ids(engine: Any, text: str) -> np.ndarray:
    # One input to the flat batch form: two byte buffers, no per-token Python objects.
    ids, _offsets = engine.encode_batch_flat([text])
    return np.frombuffer(ids, dtype="<u4")


__all__ = ["Accelerator", "fastokens_version", "probe_texts", "setting"]
