"""The bounded pool: tokenizing and rendering run on worker threads, never on the event loop. At most `size`
run at once and `depth` more wait; one more is refused at once (OverloadedError, 503 with Retry-After)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ctxlock.errors import DeadlineError, OverloadedError

T = TypeVar("T")


class Pool:
    def __init__(self, size: int, depth: int, deadline: float) -> None:
        self.size, self.depth, self.deadline = size, depth, deadline
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="ctxlock-serve")
        self._lock = threading.Lock()
        self._admitted = 0  # running + waiting

    @property
    def admitted(self) -> int:
        return self._admitted

    def _release(self, _future: object = None) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on a worker. The pool slot is held until `fn` returns, even when the caller stopped waiting at
        the deadline (a thread cannot be killed: the render's own time limit is what ends it)."""
        with self._lock:
            if self._admitted >= self.size + self.depth:
                raise OverloadedError(
                    f"{self.size} worker(s) busy and {self.depth} request(s) queued",
                    path="pool",
                    hint="retry after the Retry-After seconds, or raise limits.queue_depth / limits.pool_size",
                )
            self._admitted += 1
        try:
            future = self._executor.submit(fn)
        except RuntimeError:  # shut down
            self._release()
            raise OverloadedError(
                "the server is shutting down", path="pool", hint="retry on another instance"
            ) from None
        future.add_done_callback(self._release)
        # The deadline covers waiting in the queue and the work; the template's own limit ends a render earlier.
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=self.deadline + 1.0)
        except TimeoutError:
            raise DeadlineError(
                f"the request ran past the {self.deadline:g} s deadline",
                path="limits.render_deadline_seconds",
                hint="send a smaller request, or raise the deadline in ctxlock.toml",
            ) from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
