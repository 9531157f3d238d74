"""A deadline for code on any thread at no cost per line: the fast path of `sandbox_limits.time_limit` off the main
thread (its reference path is the line tracer; `CTXLOCK_FAST=0` selects it).

One shared daemon thread (`ctxlock-deadline`, started at the first arm, again in a forked child) keeps a heap of
armed slots ordered by deadline and sleeps until the earliest. When a slot's deadline passes while it is still
armed, the watchdog sets the slot's exception class as the target thread's asynchronous exception
(`PyThreadState_SetAsyncExc`), which CPython raises in that thread at its next bytecode boundary; while the slot stays
armed it sets it again every `REPEAT` seconds, so an exception swallowed by a broad `except` inside the work is
raised again (the interval timer on the main thread does the same).

Arming is a lock and a heap push (and a wake-up of the watchdog only when the new deadline comes before the time it
will look at the heap next); disarming is the same lock and a flag. The watchdog delivers only while holding the
lock and only to a slot that is armed; `disarm` unarms the slot under the same lock (no delivery after that) and
then lets a delivery made before it and not raised yet be raised inside `disarm`, where it is caught, so once
`disarm` has returned nothing is pending or will be delivered to the thread for that slot. A delivery raised while
`disarm` runs (the deadline passed just as the work ended) is caught there and retried; `disarm` reports it instead
of raising. Dead entries stay in the heap until they reach its top or outnumber the live ones.

Like the interval timer, an asynchronous exception is raised between bytecodes: a single long C call (a regex, a
huge `str.join`) runs to its end first. `available()` is False where `ctypes.pythonapi` is missing (not CPython).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import threading
import time
from typing import Any

REPEAT = 0.05  # seconds between deliveries to a slot still armed after its deadline

_SET: Any  # CPython's PyThreadState_SetAsyncExc, or None elsewhere
try:
    _SET = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
        ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
    )
except (AttributeError, OSError):  # no ctypes.pythonapi: not CPython
    _SET = None


def _drain() -> None:
    """Nothing: calling it (a Python frame's entry checks the eval breaker) raises an asynchronous exception that is
    pending for this thread."""


def available() -> bool:
    return _SET is not None


class Slot:
    """One armed deadline: the thread it watches, when, and the exception class to raise there."""

    __slots__ = ("armed", "deadline", "exc", "fired", "seconds", "tid")

    def __init__(self, seconds: float, exc: type[BaseException]) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.tid = threading.get_ident()
        self.exc = exc
        self.armed = False
        self.fired = 0  # deliveries made


class Watchdog:
    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # A forked child has no watchdog thread, and the lock may have been held by a thread that is not there.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Slot]] = []
        self._seq = itertools.count()
        self._live = 0
        self._thread: threading.Thread | None = None
        self._until = float("inf")  # when the watchdog thread wakes next (it examines the heap then)
        self._wakes = 0  # times the watchdog thread woke (for tests)

    def arm(self, slot: Slot) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ctxlock-deadline", daemon=True)
                self._thread.start()
            slot.armed = True
            self._live += 1
            heap = self._heap
            if len(heap) > 64 and len(heap) > 4 * self._live:
                heap[:] = [entry for entry in heap if entry[2].armed]
                heapq.heapify(heap)
            heapq.heappush(heap, (slot.deadline, next(self._seq), slot))
            if slot.deadline < self._until:
                # Woken only when this deadline comes before the watchdog's next look at the heap: a render's
                # deadline is mostly later than the one before it (ended and dead, still in the heap), so arming
                # wakes no thread (each wake was a context switch and a GIL hand-off on every request).
                self._wake.notify()

    def disarm(self, slot: Slot) -> bool:
        """Disarm `slot` (from its own thread). True when a delivery was raised during this call (caught here): the
        deadline passed as the work ended. After this returns, nothing is pending or will be delivered for `slot`."""
        interrupted = False
        while True:
            try:
                self._disarm(slot)
                if slot.fired and threading.get_ident() == slot.tid:  # only the slot's own thread can drain
                    # A delivery made before the disarm and not raised yet is raised here: entering a Python
                    # function checks for it. (Withdrawing it with SetAsyncExc(tid, NULL) would leave CPython's
                    # interpreter-wide "async exception pending" flag set until some thread raises one: every
                    # eval-breaker check then takes the slow path, and a traced thread can spin at a frame's entry.)
                    _drain()
                return interrupted
            except slot.exc:
                interrupted = True

    def disarm_thread(self) -> int:
        """Disarm every slot still armed for the calling thread (a delivery that landed at a block's exit left its
        slot armed), then raise-and-catch any delivery pending here. Returns how many were armed."""
        tid = threading.get_ident()
        with self._lock:
            stale = [entry[2] for entry in self._heap if entry[2].armed and entry[2].tid == tid]
        for slot in stale:
            self.disarm(slot)
        return len(stale)

    def _disarm(self, slot: Slot) -> None:
        with self._lock:
            if slot.armed:
                slot.armed = False
                self._live -= 1

    def live(self) -> int:
        """Armed slots (for tests: 0 once every block has ended)."""
        with self._lock:
            return self._live

    def wakes(self) -> int:
        """Times the watchdog thread woke up since start (tests: arming a later deadline wakes nothing)."""
        with self._lock:
            return self._wakes

    def _run(self) -> None:
        heap = self._heap
        with self._lock:
            while True:
                self._wakes += 1
                while heap and not heap[0][2].armed:
                    heapq.heappop(heap)
                if not heap:
                    self._until = float("inf")
                    self._wake.wait()
                    continue
                now = time.monotonic()
                when, _, slot = heap[0]
                if when > now:
                    self._until = when
                    self._wake.wait(when - now)
                    continue
                self._until = now
                # Under the lock and armed: the slot's thread cannot be past its disarm.
                _SET(slot.tid, slot.exc)
                slot.fired += 1
                heapq.heapreplace(heap, (now + REPEAT, next(self._seq), slot))


WATCHDOG = Watchdog()

__all__ = ["REPEAT", "WATCHDOG", "Slot", "Watchdog", "available"]
