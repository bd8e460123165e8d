"""Restart policy for engine processes: a dead engine is started again after a back-off,
at most ``max_restarts`` times within any ``window_s`` seconds. A restart is a rate, not a
lifetime budget: a server that runs for months survives rare faults, while an engine that
dies again and again (more than ``max_restarts`` restarts within ``window_s``) stays down
and the server stays unhealthy. The back-off doubles with each restart still inside the
window (1 s, 2 s, 4 s, ... up to 30 s) and falls back to 1 s once the window holds none.
``window_s`` 0 (or less) keeps the old meaning: ``max_restarts`` over the server's life.
The API process's runtime does the spawning; this module decides when, and remembers what
happened for ``/health``."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("mstar.server")

BASE_DELAY_S = 1.0
MAX_DELAY_S = 30.0
DEFAULT_WINDOW_S = 600.0


def restart_delay(attempt: int) -> float:
    """Seconds to wait before restart number ``attempt`` (0-based) within the window."""
    return min(MAX_DELAY_S, BASE_DELAY_S * 2**attempt)


@dataclass
class _History:
    restarts: int = 0  # over the server's life (reported, and the generation of the process)
    recent: deque[float] = field(default_factory=deque)  # monotonic times of restarts in the window
    last_exit: str | None = None
    gave_up: bool = False
    restart_at: float | None = None  # monotonic time of the scheduled restart
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, enabled: bool, max_restarts: int, window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        self._engines: dict[str, _History] = {}

    def _history(self, name: str) -> _History:
        return self._engines.setdefault(name, _History())

    def restarts(self, name: str) -> int:
        return self._history(name).restarts

    def _in_window(self, h: _History, now: float) -> int:
        if self.window_s > 0:
            while h.recent and h.recent[0] <= now - self.window_s:
                h.recent.popleft()
        return len(h.recent)

    def exited(self, name: str, reason: str, restart: Callable[[str], None]) -> None:
        """Engine ``name`` died (``reason``: exit code or signal): schedule ``restart(name)``
        unless restarts are off or it was restarted ``max_restarts`` times within the window."""
        h = self._history(name)
        h.last_exit = reason
        if not self.enabled:
            return
        now = self.clock()
        recent = self._in_window(h, now)
        if recent >= self.max_restarts:
            h.gave_up = True
            within = f"within {self.window_s:g}s" if self.window_s > 0 else "over the server's life"
            log.error("engine %s stays down: it was restarted %d times %s (the limit)", name, recent, within)
            return
        delay = restart_delay(recent)
        h.restarts += 1
        h.recent.append(now)
        h.restart_at = now + delay
        log.warning("restarting engine %s in %.0fs (restart %d; %d of at most %d within the window)", name, delay, h.restarts, recent + 1, self.max_restarts)

        def fire() -> None:
            h.timer = None
            restart(name)

        h.timer = asyncio.get_running_loop().call_later(delay, fire)

    def ready(self, name: str) -> None:
        h = self._history(name)
        if h.restart_at is not None:
            log.info("engine %s is back after restart %d", name, h.restarts)
        h.restart_at = None

    def pending(self) -> bool:
        """Some engine is waiting for its restart or starting again."""
        return any(h.restart_at is not None for h in self._engines.values())

    def retry_after_s(self) -> int:
        waits = [h.restart_at - self.clock() for h in self._engines.values() if h.restart_at is not None]
        return max(1, math.ceil(max(waits, default=0.0)) + 1)

    def describe(self, name: str) -> dict[str, Any]:
        h = self._history(name)
        out: dict[str, Any] = {"restarts": h.restarts}
        if h.last_exit:
            out["last_exit"] = h.last_exit
        if h.restart_at is not None:
            out["restarting"] = True
        if h.gave_up:
            out["restart_limit_reached"] = True
        return out

    def cancel(self) -> None:
        for h in self._engines.values():
            if h.timer is not None:
                h.timer.cancel()
                h.timer = None
