"""Restart policy for engine processes: a dead engine is started again after a back-off
(1 s, 2 s, 4 s, ... up to 30 s) until it has been restarted ``max_restarts`` times; after
that it stays down and the server stays unhealthy. The API process's runtime does the
spawning; this module decides when, and remembers what happened for ``/health``."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("mstar.server")

BASE_DELAY_S = 1.0
MAX_DELAY_S = 30.0


def restart_delay(attempt: int) -> float:
    """Seconds to wait before restart number ``attempt`` (0-based)."""
    return min(MAX_DELAY_S, BASE_DELAY_S * 2**attempt)


@dataclass
class _History:
    restarts: int = 0
    last_exit: str | None = None
    restart_at: float | None = None  # monotonic time of the scheduled restart
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, enabled: bool, max_restarts: int) -> None:
        self.enabled = enabled
        self.max_restarts = max_restarts
        self._engines: dict[str, _History] = {}

    def _history(self, name: str) -> _History:
        return self._engines.setdefault(name, _History())

    def restarts(self, name: str) -> int:
        return self._history(name).restarts

    def exited(self, name: str, reason: str, restart: Callable[[str], None]) -> None:
        """Engine ``name`` died (``reason``: exit code or signal): schedule ``restart(name)``
        unless restarts are off or used up."""
        h = self._history(name)
        h.last_exit = reason
        if not self.enabled:
            return
        if h.restarts >= self.max_restarts:
            log.error("engine %s stays down: it was restarted %d times already", name, h.restarts)
            return
        delay = restart_delay(h.restarts)
        h.restarts += 1
        h.restart_at = time.monotonic() + delay
        log.warning("restarting engine %s in %.0fs (restart %d of at most %d)", name, delay, h.restarts, self.max_restarts)

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
        waits = [h.restart_at - time.monotonic() for h in self._engines.values() if h.restart_at is not None]
        return max(1, math.ceil(max(waits, default=0.0)) + 1)

    def describe(self, name: str) -> dict[str, Any]:
        h = self._history(name)
        out: dict[str, Any] = {"restarts": h.restarts}
        if h.last_exit:
            out["last_exit"] = h.last_exit
        if h.restart_at is not None:
            out["restarting"] = True
        return out

    def cancel(self) -> None:
        for h in self._engines.values():
            if h.timer is not None:
                h.timer.cancel()
                h.timer = None
