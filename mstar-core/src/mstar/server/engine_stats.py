"""An engine process's statistics: ``Engine.stats()`` snapshots as wire messages, taken
on a thread of their own.

``Engine.stats()`` waits for the step in progress to end (it shares the engine's lock),
so it must not run on the sender thread, where it would hold back a step's outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from mstar.server.messages import EngineStats, NodeKV, NodeOutputCache, Stats


def engine_stats(engine: Any) -> EngineStats:
    """One consistent snapshot of ``engine`` (an ``mstar.Engine``) for the wire."""
    s = engine.stats()
    kv = [
        NodeKV(node, v["used_blocks"], v["total_blocks"], v.get("cached_blocks", 0), v.get("prefix_queried_tokens", 0),
               v.get("prefix_hit_tokens", 0), v.get("prefix_evictions", 0), v.get("block_bytes", 0), v.get("cross_blocks", -1))
        for node, v in s["kv"].items()
    ]
    # The last batch's size means nothing once nothing runs.
    batch = s["last_batch_size"] if s["running"] else 0
    caches = [NodeOutputCache(node, **v) for node, v in s.get("output_cache", {}).items()]
    return EngineStats(s["waiting"], s["running"], batch, kv, s["steps"], s["preemptions"], s["requests"], caches)


class StatsReporter:
    """Every ``interval_s``: a ``Stats`` report through ``emit`` when anything changed."""

    def __init__(self, name: str, engine: Any, emit: Callable[[Stats], None], interval_s: float) -> None:
        self.name = name
        self.engine = engine
        self.emit = emit
        self.interval_s = interval_s
        self.last: EngineStats | None = None  # the latest snapshot taken
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mstar-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            stats = engine_stats(self.engine)
            if stats != self.last:
                self.emit(Stats(self.name, stats))
            self.last = stats
