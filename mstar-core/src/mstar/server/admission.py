"""``--max-concurrency``: at most N requests in the engines; the rest wait in a bounded
FIFO queue, and a full queue answers 429."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from mstar.api.errors import ApiError


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, on_change: Callable[[int, int], None] | None = None) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_change = on_change

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            self._changed()
            return
        if len(self._waiters) >= self.max_queue:
            raise ApiError(429, f"the server is at capacity ({self.max_concurrency} running, {self.max_queue} queued); retry later", code="queue_full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._changed()
        try:
            await fut  # release() hands its slot over: running is unchanged
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot arrived just as we gave up: pass it on
            else:
                self._waiters.remove(fut)
                self._changed()
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._changed()
                return
        self.running -= 1
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.running, len(self._waiters))
