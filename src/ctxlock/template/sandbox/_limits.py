"""The bounds of a sandboxed render (`ctxlock.template.sandbox`):
what a template may build, how long it may run, and what
it may print.

- `RenderLimits`: the bounds of one render, a fixed allowance plus a share that grows with the render's input
  (`input_chars`); `DEFAULT_LIMITS` are wide enough for every real template.
- `RenderState`: the per-render budget (characters of new strings, items of new lists) and the seeded random
  generator, in a context variable (`current_state()`; outside a render an unbounded state answers). Every hook that
  builds a string or a list charges it here before or after it runs (`Limit` when over).
- `check_printable` and `FixedOrderSet`: a value whose text would differ between processes (a memory address, a set
  in hash order) is refused (`Nondeterministic`) or printed in one fixed order.
- `time_limit`: the wall clock: an interval timer on the main thread, the shared watchdog thread (`_watchdog`)
  elsewhere, or a line tracer (the reference path, `CTXLOCK_FAST=0`).
- `running_line` / `where`: the template line that is running, for messages.
"""

from __future__ import annotations

import _signal
import inspect
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from types import CodeType, FrameType, FunctionType
from typing import Any

import jinja2
import jinja2.runtime
import jinja2.utils

from ctxlock.settings import fast_enabled
from ctxlock.template._taint import Tainted
from ctxlock.template.sandbox import _watchdog


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one render: what a template may add beyond the size of its input. Real templates need milliseconds
    and kilobytes over their input; the defaults leave wide room.

    Each bound is a fixed allowance plus a share proportional to the render's input (`input_chars`: the characters of
    the strings in the messages, tools, documents and variables the template receives), so a 10 MB conversation
    renders with the standard templates while a template still cannot turn a short request into gigabytes or minutes:
    - output: `max_output_chars + output_per_input_char * input_chars` characters, which also bounds any one string
      or list a template builds;
    - everything a render builds (characters of new strings plus items of new lists), which is what bounds memory:
      `max_created` (default 4 x the output bound) plus the same multiple of the output's input share;
    - wall time: `max_seconds + seconds_per_input_mchar * input_chars / 1e6`.
    Source size and compile time are fixed (they do not depend on the input). `scaled(input_chars)` gives the bounds
    of one render as plain numbers."""

    max_seconds: float = 5.0
    max_output_chars: int = 8_000_000
    max_source_chars: int = 256_000  # the largest real chat templates are under 20 kB
    max_width: int = 65_536  # padding, format width and precision
    max_created: int | None = None  # default: 4 x max_output_chars
    output_per_input_char: float = 4.0  # a template that prints each message twice, and its tools as JSON, fits
    seconds_per_input_mchar: float = 5.0  # the standard templates take well under a second per million characters

    @property
    def created_budget(self) -> int:
        return self.max_created if self.max_created is not None else 4 * self.max_output_chars

    def scaled(self, input_chars: int) -> RenderLimits:
        """The bounds of one render whose input holds `input_chars` characters (the allowances added, the per-input
        shares zeroed so that scaling twice changes nothing)."""
        if input_chars <= 0:
            return self
        extra_output = int(self.output_per_input_char * input_chars)
        return RenderLimits(
            max_seconds=self.max_seconds + self.seconds_per_input_mchar * input_chars / 1e6,
            max_output_chars=self.max_output_chars + extra_output,
            max_source_chars=self.max_source_chars,
            max_width=self.max_width,
            max_created=self.created_budget + 4 * extra_output,
            output_per_input_char=0.0,
            seconds_per_input_mchar=0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_seconds": self.max_seconds,
            "max_output_chars": self.max_output_chars,
            "max_source_chars": self.max_source_chars,
            "max_width": self.max_width,
            "max_created": self.max_created,
            "output_per_input_char": self.output_per_input_char,
            "seconds_per_input_mchar": self.seconds_per_input_mchar,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RenderLimits:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if data.get(k) is not None})


def input_chars(value: Any) -> int:
    """The characters of every string in `value` (mappings, sequences and sets walked; keys counted): the size of
    what a render receives, which its limits grow with. Other values count nothing."""
    # The exact types a render's context is made of are told apart by identity first (an abc `isinstance` against
    # `Mapping` costs about a microsecond per value), and a dict's or a list's strings are counted where they are
    # met, without a trip through the stack; every other type takes the general checks, so the count is the same
    # for any value.
    total = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is dict:
            for k in v:
                if type(k) is str or type(k) is Tainted:
                    total += len(k)
                else:
                    push(k)
            items: Any = v.values()
        elif t is list or t is tuple:
            items = v
        elif t is str or t is Tainted:
            total += len(v)
            continue
        elif v is None or t is bool or t is int or t is float or t is FunctionType:
            continue
        elif isinstance(v, str):
            total += len(v)
            continue
        elif isinstance(v, Mapping):
            extend(v.keys())
            extend(v.values())
            continue
        elif isinstance(v, (list, tuple, set, frozenset)):
            extend(v)
            continue
        else:
            continue
        for x in items:
            tx = type(x)
            if tx is str or tx is Tainted:
                total += len(x)
            elif not (x is None or tx is bool or tx is int or tx is float):
                push(x)
    return total


DEFAULT_LIMITS = RenderLimits()
MAX_INT_BITS = 1 << 20  # `*` and `**` on integers: a million bits (315,000 digits) is far past any real template


class Limit(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------------------------------------------
# Per-render state: the budget, the limits, and what the provenance rule asks of the render.


class RenderState:
    __slots__ = (
        "_rng",
        "created",
        "draws",
        "emitted",
        "generation",
        "limits",
        "max_items",
        "max_single",
        "seed",
        "template",
    )

    def __init__(
        self,
        limits: RenderLimits,
        template: jinja2.Template | None,
        seed: int = 0,
        draws: list[dict[str, Any]] | None = None,
    ) -> None:
        self.limits = limits
        self.max_single = limits.max_output_chars
        self.max_items = max(1024, limits.max_output_chars // 8)
        self.created = 0
        self.template = template
        # The one source of randomness a template has (the `random` filter, `lipsum`): seeded per render, so the
        # same inputs and seed give the same text in every process; every draw is logged in `draws`. Built at the
        # first draw (seeding a Mersenne Twister costs more than a short render).
        self.seed = seed
        self._rng: random.Random | None = None
        self.draws = draws if draws is not None else []
        # `{% generation %}` blocks: each one's [start, end) in the output, as transformers' AssistantTracker records
        # them (the characters emitted before the block; `emitted` is kept by `render_limited`).
        self.generation: list[tuple[int, int]] = []
        self.emitted = 0

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def charge(self, n: int, what: str) -> None:
        """A new string of n characters."""
        if n > self.max_single:
            raise Limit(f"{what} would build {n:,} characters (limit {self.max_single:,})")
        self._count(n)

    def items(self, n: int, what: str) -> None:
        """A new list of n items."""
        if n > self.max_items:
            raise Limit(f"{what} would build a list of {n:,} items (limit {self.max_items:,})")
        self._count(n)

    def _count(self, n: int) -> None:
        self.created += n
        if self.created > self.limits.created_budget:
            raise Limit(f"the render built more than {self.limits.created_budget:,} characters and items")

    def width(self, n: Any, what: str) -> None:
        if isinstance(n, int) and n > self.limits.max_width:
            raise Limit(f"{what} of {n:,} is over the limit of {self.limits.max_width:,}")


STATE: ContextVar[RenderState | None] = ContextVar("ctxlock_render_state", default=None)
_UNBOUNDED = RenderState(RenderLimits(max_created=1 << 62), None)


def current_state() -> RenderState:
    return STATE.get() or _UNBOUNDED


def where() -> str:
    """`line N` of the template frame that is running (for messages), or ""."""
    line = running_line()
    return f"at template line {line}" if line is not None else ""


def running_line() -> int | None:
    """The template line that is running (the innermost template frame), or None outside a render."""
    state = STATE.get()
    frame: FrameType | None = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_filename == "<template>":
            line = frame.f_lineno
            if state is not None and state.template is not None:
                with suppress(Exception):
                    line = state.template.get_corresponding_lineno(line)
            return line
        frame = frame.f_back
    return None


class Nondeterministic(Exception):
    """The render would print a memory address (different in every process): refused, with the template line."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_VALUE_TYPES = (str, int, float, type(None), jinja2.Undefined)


def _set_key(x: Any) -> tuple[str, str]:
    return (type(x).__name__, repr(x))


class FixedOrderSet(set[Any]):
    """A set a template built (`d.keys() - [...]`, `a.items() - b.items()`, a set method) that iterates and prints in
    one fixed order, sorted by (type name, repr). A plain set of strings iterates in an order that changes with
    PYTHONHASHSEED, so `{{ d.keys() - [] }}` or `|join` over it would give another text in every process; this is
    one of the orders transformers could print, the same in every run (README: Differences from the references)."""

    __slots__ = ()

    def __iter__(self) -> Any:
        return iter(sorted(set.__iter__(self), key=_set_key))

    def __repr__(self) -> str:
        return "{" + ", ".join(repr(x) for x in self) + "}" if self else "set()"

    __str__ = __repr__


def fixed_order(value: Any) -> Any:
    return FixedOrderSet(value) if isinstance(value, (set, frozenset)) and type(value) is not FixedOrderSet else value


def check_printable(value: Any, what: str) -> None:
    """Refuse to turn into text a value whose text is a memory address (`<function f at 0x7f...>`, a method, a
    generator from `map`/`select`, a cycler or joiner object): jinja prints it as Python's repr, which differs in
    every process, so the render would not be reproducible. Containers are walked; values are never printed."""
    t = type(value)
    if t is str or t is Tainted or t is int or t is bool or value is None:
        return
    stack = [value]
    seen = 0
    while stack and seen < 100_000:
        v = stack.pop()
        seen += 1
        if isinstance(v, _VALUE_TYPES):
            continue
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif isinstance(v, jinja2.utils.Namespace):
            stack.extend(getattr(v, "_Namespace__attrs", {}).values())
        elif not isinstance(v, (type, jinja2.runtime.Macro)):
            # A class prints as its name and a macro as `<Macro 'name'>`; a function, a method (in transformers,
            # `<built-in method upper of str object at 0x...>`) or an object without a repr of its own prints
            # its address.
            shown = repr(v)
            if _ADDRESS.search(shown) or callable(v):
                kind = type(v).__name__
                shown = _ADDRESS.sub(" at 0x…", shown).replace("Tainted.", "str.")
                raise Nondeterministic(
                    f"{what} would print a {kind} as {shown[:80]!r}, which is not a value: its text is a memory "
                    "address that differs in every run",
                    running_line(),
                )


def deep_size(value: Any, limit: int) -> int:
    """About the length of `str(value)` or `json.dumps(value)`: string lengths plus a few characters per item, counted
    until `limit` is passed."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 4
        elif isinstance(v, dict):
            total += 2 * len(v) + 2
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 * len(v) + 2
            stack.extend(v)
        else:
            total += 24
    return total


# ---------------------------------------------------------------------------------------------------------------
# Wall time: an interval timer (SIGALRM) on the main thread, the watchdog thread elsewhere, or a line tracer.


class DeadlineExpired(Limit):
    """What the watchdog raises in a thread past its deadline (it can only name a class); `time_limit` turns it into
    the same `Limit` the other paths raise."""

    def __init__(self, message: str = "the template took longer than its deadline") -> None:
        super().__init__(message)


class _Deadline:
    def __init__(self, seconds: float, every_frame: bool) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.ticks = 0
        self.armed = True
        self.every_frame = every_frame
        self.mechanism = "tracer"
        self.fired = False  # the deadline was raised in the block at least once

    def expired(self) -> Limit:
        self.fired = True
        return Limit(f"the template took longer than {self.seconds:g} s")

    def outcome(self, ev: BaseException | None) -> Limit | None:
        """What a block that ends with `ev` after its deadline fired must raise: the deadline, whatever the code
        made of it. A deadline raised in the middle of jinja's or Python's own code can leave it in a state that
        fails differently (a `TypeError` comparing with None was seen, once in a few runs of a recursive macro
        bomb), or be caught and turned into another error: once it fired, the render is over its time anyway."""
        if self.fired and ev is not None and not isinstance(ev, Limit):
            return Limit(f"the template took longer than {self.seconds:g} s")
        return None

    def local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        self.ticks += 1
        if self.ticks & 0xFF == 0 and time.monotonic() > self.deadline:
            raise self.expired()
        return self.local

    def global_(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        # Rendering: only the compiled template's code is traced, jinja's runtime and our filters run at full speed.
        # Compiling: jinja's lexer, parser and code generator are the work, so every frame is.
        code: CodeType = frame.f_code
        if self.every_frame or code.co_filename == "<template>":
            return self.local
        return None

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            raise self.expired()


def _alarm_free() -> bool:
    """SIGALRM is ours to use: main thread, no handler installed by the host, no interval timer running."""
    # `_signal.getsignal`: `signal.getsignal` turns the handler into an enum member first (about a microsecond, on
    # every render); SIG_DFL and SIG_IGN are the ints 0 and 1 either way (IntEnum members compare equal to them).
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and _signal.getsignal(_SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


def deadline_mechanism(tracer: bool | None = None) -> str:
    """How `time_limit` bounds the clock here: "alarm" (an interval timer; main thread, SIGALRM free), "watchdog"
    (the shared watchdog thread; any other thread) or "tracer" (a line tracer: the reference path, selected by
    `CTXLOCK_FAST=0` or `tracer=True`, and used where asynchronous exceptions are not available)."""
    if tracer:
        return "tracer"
    if _alarm_free():
        return "alarm"
    if _watchdog.available() and (tracer is False or fast_enabled()):
        return "watchdog"
    return "tracer"


def time_limit(seconds: float, *, tracer: bool | None = None, every_frame: bool = False) -> AbstractContextManager[Any]:
    """Stop work that runs past `seconds` with `Limit` (`with time_limit(s) as deadline:`). On the main thread an
    interval timer raises from the signal handler; on other threads the shared watchdog thread raises in the thread
    (`_watchdog`); neither costs anything per template line, and both raise again every 50 ms after the deadline, so
    an exception swallowed by a broad `except` inside jinja is raised again. The reference path (`CTXLOCK_FAST=0`, or
    `tracer=True`) is a line tracer that checks the clock every 256 lines. `deadline_mechanism()` says which one
    applies; `deadline.mechanism` says which one did."""
    deadline = _Deadline(seconds, every_frame)
    deadline.mechanism = deadline_mechanism(tracer)
    if deadline.mechanism == "watchdog":
        return _WatchdogBlock(deadline)
    if deadline.mechanism == "alarm":
        return _AlarmBlock(deadline)
    return _tracer(deadline)


@contextmanager
def _tracer(deadline: _Deadline) -> Iterator[_Deadline]:
    previous_trace = sys.gettrace()
    sys.settrace(deadline.global_)
    try:
        yield deadline
    except BaseException as exc:
        limit = deadline.outcome(exc)
        if limit is not None:
            raise limit.with_traceback(exc.__traceback__) from None
        raise
    finally:
        sys.settrace(previous_trace)


# SIGALRM as the C module `_signal` takes it. `signal.signal` is `_signal.signal` wrapped to turn the handler it
# returns into an enum member, which costs about 3 us for a function handler (enum lookup that fails): the interval
# timer is armed and disarmed on every render on the main thread, so the handlers are swapped with `_signal` itself.
# Restoring the int it returns for SIG_DFL/SIG_IGN installs the same disposition (`signal.getsignal` reads it back as
# the same enum member).
_SIGALRM = int(signal.SIGALRM)


class _AlarmBlock:
    """The interval timer's context manager (main thread, SIGALRM free: `_alarm_free`): the handler installed and the
    timer armed on entry; on exit the deadline is disarmed first, then the timer, then the host's handler restored."""

    __slots__ = ("deadline", "previous")

    def __init__(self, deadline: _Deadline) -> None:
        self.deadline = deadline
        self.previous: Any = None

    def __enter__(self) -> _Deadline:
        self.previous = _signal.signal(_SIGALRM, self.deadline.on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.deadline.seconds, 0.05)
        return self.deadline

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: Any) -> None:
        self.deadline.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        _signal.signal(_SIGALRM, self.previous)
        limit = self.deadline.outcome(ev)
        if limit is not None:
            raise limit.with_traceback(tb) from None


def settle_deadlines() -> int:
    """After a `DeadlineExpired` that left its `with time_limit` without the block's exit running (the delivery
    landed at `__exit__`'s entry): disarm the calling thread's watchdog slots now, so nothing is raised into this
    thread again. Cheap and a no-op when nothing is armed; returns how many slots it disarmed."""
    return _watchdog.WATCHDOG.disarm_thread() if _watchdog.available() else 0


class _WatchdogBlock:
    """The watchdog's context manager: a class, not a generator, so that no Python code of contextlib's runs while
    the slot is armed; `__exit__` disarms before anything else (`Watchdog.disarm` catches a delivery raised in it).
    The one check left outside a `try` is `__exit__`'s own entry: a delivery raised there (the deadline passed as the
    block ended) leaves the `with` as `DeadlineExpired`; the render's handler then calls `settle_deadlines()`, and
    `__del__` disarms the slot if nothing else did."""

    __slots__ = ("deadline", "slot")

    def __init__(self, deadline: _Deadline) -> None:
        self.deadline = deadline
        self.slot = _watchdog.Slot(deadline.seconds, DeadlineExpired)

    def __enter__(self) -> _Deadline:
        try:
            _watchdog.WATCHDOG.arm(self.slot)
        except DeadlineExpired:  # a deadline so short that it passed inside `arm`
            _watchdog.WATCHDOG.disarm(self.slot)
            raise self.deadline.expired() from None
        return self.deadline

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: Any) -> None:
        try:
            interrupted = _watchdog.WATCHDOG.disarm(self.slot)
        except DeadlineExpired:  # raised at the call, before `disarm`'s own `try`
            interrupted = _watchdog.WATCHDOG.disarm(self.slot) or True
        self.deadline.armed = False
        if self.slot.fired and (isinstance(ev, DeadlineExpired) or (ev is not None and not isinstance(ev, Limit))):
            # The deadline, whatever the code made of it (DeadlineExpired itself, or what it left behind: see
            # `_Deadline.outcome`). The traceback keeps the template frame (the error names that line).
            raise self.deadline.expired().with_traceback(tb) from None
        if interrupted and ev is None:
            raise self.deadline.expired()  # the deadline passed as the block ended: it still counts

    def __del__(self) -> None:
        if self.slot.armed:
            _watchdog.WATCHDOG.disarm(self.slot)


__all__ = [
    "DEFAULT_LIMITS",
    "MAX_INT_BITS",
    "STATE",
    "DeadlineExpired",
    "FixedOrderSet",
    "Limit",
    "Nondeterministic",
    "RenderLimits",
    "RenderState",
    "check_printable",
    "current_state",
    "deadline_mechanism",
    "deep_size",
    "fixed_order",
    "input_chars",
    "running_line",
    "settle_deadlines",
    "time_limit",
    "where",
]
