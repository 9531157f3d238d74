"""fastokens as the native call of whole-text encoding, admitted only after it agrees with tiktoken on the vocabulary.

`prefix.WholeText` encodes a rendered text in one native call. tiktoken makes that call where `fastbpe.check`
proved rank-based BPE equal to the vocabulary's merge-list BPE (and `whole_text_refusal` found the added tokens
plain). Under those same conditions the `tokenizer.json` pipeline is: an optional NFC normalizer (inert text only
reaches the native call), the added tokens matched on raw text, one split regex, byte-level mapping and BPE whose
merges are rank-consistent. fastokens (a native reimplementation of `tokenizers`, with the split regex on PCRE2's
JIT and a pre-token cache) runs that pipeline from the same `tokenizer.json`, about ten times faster than tiktoken
on chat text. Nothing in its construction proves it equal, so it is admitted by checking, not assumed:

1. it is built from the exact `tokenizer.json` bytes the tokenizer was loaded from, on a daemon thread, once the
   work done without it would have paid for it: loading a 150k vocabulary takes about 1.2 s of CPU, and it slows
   the thread that encodes meanwhile (by half on this project's 2-core machine: it holds the GIL part of the time
   and takes the other core), so a short job or the first pass of a fresh process is faster without it. The build
   starts when tiktoken has encoded `start_after()` characters of whole text for this vocabulary (8M by default,
   about the characters tiktoken encodes in the build's CPU time: the rule of ski rental, whose cost is at most
   twice that of knowing the future; `CTXLOCK_FASTOKENS_AFTER=N` sets it, `CTXLOCK_FASTOKENS=eager` starts it on
   the first encode). Until it is ready, and whenever it is refused, tiktoken makes the call, with identical ids.
   `Model.warm_up()` builds it and waits, as a server would at start-up; describing a tokenizer (records,
   `ctxlock render`) never starts it;
2. before it is used, its ids must equal tiktoken's on probe texts that hold every token of the vocabulary that is
   valid UTF-8, every added token between and next to text, and whitespace, digit, case and script mixtures
   (`probe_texts`); one difference refuses it, and the reason names the probe and the token;
3. any exception from a call (a PCRE2 resource limit on a pathological text, say) sends that text to tiktoken.

The test suite then compares both engines with `tokenizers` on llama.cpp's vectors and on hypothesis texts for every
vocabulary where whole-text encoding is taken (`tests/tokenizer/test_prefix.py`).

`CTXLOCK_FASTOKENS=0` keeps tiktoken; `CTXLOCK_FASTOKENS=sync` builds and checks it in the calling thread, on first
use (deterministic, for tests); `CTXLOCK_FASTOKENS=eager` starts the background build on the first encode.

**The verdict is kept on disk.** What step 2 proves is a fact about three things: the `tokenizer.json` bytes, the
fastokens release and this module's probes (`CHECK_VERSION`; the exact path it compares with is tiktoken, whose
release is in the key too). The verdict, admitted or refused on a probe, is written under the conversion cache's root
(`<cache>/fastokens/<key>.json`, written atomically) with a key that hashes all of them, and a later process that
builds fastokens for the same bytes takes the verdict instead of probing again. An entry that is unreadable, corrupt
or names another digest or release counts as absent: the probes run and the entry is rewritten. Failures that are
not facts about those inputs (fastokens not installed, a build that raises, an interpreter exiting mid-check) are
never written. The reason says when a verdict came from the cache.

**Exit.** A daemon thread that comes back from native code while the interpreter finalizes is killed with a forced
unwind, which fastokens' and tiktoken's native frames turn into `FATAL: exception not rethrown` (exit code 134). So
an `atexit` hook stops the probes at the next text and waits for the thread to leave the native call it is in
(the build of a 150k vocabulary takes about 1.2 s), before finalization begins.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ctxlock.settings import cache_root

# Bump when what the check proves changes (the probes, how ids are compared): verdicts cached under another are unused.
CHECK_VERSION = "accel-1"
# The longest an exiting interpreter waits for a build or a probe in native code (a 150k vocabulary builds in ~1.2 s).
EXIT_WAIT_SECONDS = 120.0

# Whitespace, digits, case, contractions, scripts and symbols around which split regexes differ most.
_MIXED = (
    "Hello world! HELLO World's 'S 'll 'VE i'm   spaces\t\ttabs\n\n\nnewlines \r\n crlf  \n  x\u00a0nbsp"
    " 1 12 123 1234 12345 3.14159 1,000,000 0x1F -42 ９８ ٣٤ 𝟙𝟚 "
    "def f(x):\n    return x ** 2  # comment\n\tif (a && b || !c) { y[i] += 1; }\n"
    "天空为什么是蓝色 東京タワー 한국어 текст Ελληνικά עברית العربية हिन्दी ไทย "
    "😀🚀 👩‍👩‍👧‍👦 🇯🇵 ✨ é e\u0301 ﬁ Å ß ẞ ǅ   \u200b\u2028\u3000"
)


# Characters of whole text tiktoken encodes before the background build starts: about what tiktoken encodes in the
# build's CPU time (~1.2 s at ~7M characters/s on chat text), so that the build is paid for by work already done.
START_AFTER_CHARS = 8_000_000


def setting() -> str:
    """`CTXLOCK_FASTOKENS`: "1" (default: a daemon thread builds it once `start_after()` characters were encoded
    without it), "eager" (the first encode starts that thread), "0" (never), "sync" (the first encode builds it, in
    the calling thread)."""
    value = os.environ.get("CTXLOCK_FASTOKENS", "1").strip().lower()
    return value if value in ("0", "sync", "eager") else "1"


def start_after() -> int:
    """`CTXLOCK_FASTOKENS_AFTER` (characters, default `START_AFTER_CHARS`): whole text encoded by tiktoken before the
    background build starts under the default setting. A value that is not a non-negative integer is ignored."""
    raw = os.environ.get("CTXLOCK_FASTOKENS_AFTER", "").strip()
    return int(raw) if raw.isdigit() else START_AFTER_CHARS


def fastokens_version() -> str | None:
    return _library_version("fastokens")


def _library_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def verdict_key(json_sha256: str) -> str:
    """The cache key of a verdict on the `tokenizer.json` with this sha256: it also hashes the fastokens and tiktoken
    releases and `CHECK_VERSION`, so a changed file, library or check never reuses a verdict."""
    parts = [json_sha256, fastokens_version() or "-", _library_version("tiktoken") or "-", CHECK_VERSION]
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def _verdict_path(key: str) -> Any:

    return cache_root() / "fastokens" / f"{key}.json"


def load_verdict(json_sha256: str) -> tuple[str, str] | None:
    """The cached (state, reason) for this `tokenizer.json` digest and the installed releases, or None (absent,
    unreadable, corrupt, or written for other inputs)."""
    key = verdict_key(json_sha256)
    try:
        data = json.loads(_verdict_path(key).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    expected = {
        "key": key,
        "json_sha256": json_sha256,
        "fastokens": fastokens_version(),
        "tiktoken": _library_version("tiktoken"),
        "check_version": CHECK_VERSION,
    }
    if any(data.get(k) != v for k, v in expected.items()):
        return None
    state, reason = data.get("state"), data.get("reason")
    if state not in ("ready", "refused") or not isinstance(reason, str) or not reason:
        return None
    return state, reason


def store_verdict(json_sha256: str, state: str, reason: str) -> None:
    """Write the verdict atomically (a temporary file renamed into place); a cache that cannot be written is not an
    error (the next process checks again)."""
    import tempfile

    key = verdict_key(json_sha256)
    path = _verdict_path(key)
    data = {
        "key": key,
        "json_sha256": json_sha256,
        "fastokens": fastokens_version(),
        "tiktoken": _library_version("tiktoken"),
        "check_version": CHECK_VERSION,
        "state": state,
        "reason": reason,
    }
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, ensure_ascii=False)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


_CACHED_NOTE = ", proved in an earlier process: verdict read from the on-disk cache"

# Build threads still running, and the flag that stops their probes when the interpreter exits.
_RUNNING: set[threading.Thread] = set()
_RUNNING_LOCK = threading.Lock()
_EXITING = threading.Event()


def _wait_at_exit() -> None:
    """Run by `atexit`, before finalization: stop the probes and wait for every build thread to leave native code."""
    _EXITING.set()
    with _RUNNING_LOCK:
        threads = list(_RUNNING)
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_wait_at_exit)


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
        *,
        json_sha256: str | None = None,
    ) -> None:
        """`build()`: the fastokens tokenizer; `reference(text)`: the exact ids (uint32) for a text, None to skip
        it; `probes()`: the texts to compare them on. `json_sha256`: the digest of the exact `tokenizer.json` text
        `build` loads, which keys the verdict on disk (None: nothing is read or written)."""
        self._json_sha256 = json_sha256
        self.cached = False  # whether the verdict came from the on-disk cache
        self._build = build
        self._reference = reference
        self._probes = probes
        self._engine: Any = None
        self._done = threading.Event()
        self._started = False
        self.owed = 0  # characters encoded without it while it was not started (see `start_after`)
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
            thread = threading.Thread(target=self._run_tracked, name="ctxlock-fastokens", daemon=True)
            with _RUNNING_LOCK:
                _RUNNING.add(thread)
            thread.start()

    def _run_tracked(self) -> None:
        try:
            self._run()
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(threading.current_thread())

    def _run(self) -> None:
        cached = load_verdict(self._json_sha256) if self._json_sha256 else None
        if cached is not None and cached[0] == "refused":
            self.cached = True
            self._finish("refused", cached[1] + _CACHED_NOTE)
            return
        try:
            engine = self._build()
        except ImportError:
            self._finish("refused", "fastokens is not installed")
            return
        except Exception as exc:  # a tokenizer.json it cannot load
            self._finish("refused", f"fastokens could not load the tokenizer.json: {exc}")
            return
        if cached is not None:
            self.cached = True
            self._finish("ready", cached[1] + _CACHED_NOTE, engine)
            return
        checked = ids = 0
        try:
            for n, text in enumerate(self._probes()):
                if _EXITING.is_set():
                    self._finish("refused", "the interpreter exited before the check was done")
                    return
                expected = self._reference(text)
                if expected is None:
                    continue
                got = _ids(engine, text)
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    n_common = min(len(got), len(expected))
                    k = int(np.argmax(got[:n_common] != expected[:n_common])) if n_common else 0
                    self._verdict(
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
        self._verdict("ready", f"{version}, ids equal to the exact path on {checked} probe texts ({ids:,} ids)", engine)

    def _verdict(self, state: str, reason: str, engine: Any = None) -> None:
        """Finish with what the probes proved, and keep it on disk for later processes."""
        if self._json_sha256:
            store_verdict(self._json_sha256, state, reason)
        self._finish(state, reason, engine)

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
        """fastokens' ids for `text` (uint32), or None: not admitted (yet), or the call failed. None also counts
        `text` as work done without it; the build starts on a daemon thread once that work reaches `start_after()`
        characters (at once under CTXLOCK_FASTOKENS=eager), or here under CTXLOCK_FASTOKENS=sync."""
        engine = self._engine
        if engine is None:
            if self._started:
                return None
            mode = setting()
            if mode != "sync":
                self.owed += len(text)
                if mode == "eager" or self.owed >= start_after():
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

    def encode_many(self, texts: list[str]) -> list[np.ndarray | None]:
        """`[encode(t) for t in texts]`, in one fastokens call once it is admitted (`encode_batch_flat` encodes each
        input on its own: text i's ids are those of a call on it alone). When that call raises, each text is
        encoded on its own, as `encode` does (a failure counted per text it fails on, that text then None)."""
        engine = self._engine
        if engine is None or not texts:
            return [self.encode(t) for t in texts]
        try:
            ids, offsets = engine.encode_batch_flat(texts)
            flat = np.frombuffer(ids, dtype="<u4")
            ends = np.frombuffer(offsets, dtype="<u8").tolist()
        except Exception:
            return [self.encode(t) for t in texts]
        if len(ends) != len(texts) + 1 or ends[0] != 0 or ends[-1] != len(flat):
            return [self.encode(t) for t in texts]
        return [flat[a:b] for a, b in itertools.pairwise(ends)]

    def describe(self) -> str:
        if self.state == "not started" and self.owed and setting() == "1":
            return f"not started: {self.owed:,} of {start_after():,} characters encoded without it"
        return f"{self.state}: {self.reason}" if self.reason else self.state


def _ids(engine: Any, text: str) -> np.ndarray:
    # One input to the flat batch form: two byte buffers, no per-token Python objects.
    ids, _offsets = engine.encode_batch_flat([text])
    return np.frombuffer(ids, dtype="<u4")


__all__ = [
    "CHECK_VERSION",
    "Accelerator",
    "fastokens_version",
    "load_verdict",
    "probe_texts",
    "setting",
    "start_after",
    "store_verdict",
    "verdict_key",
]
