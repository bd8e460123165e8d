"""Engine statistics on the wire: ``Engine.stats()`` snapshots, taken on their own thread."""

from __future__ import annotations

import threading
import time

from mstar.server.engine_stats import StatsReporter, engine_stats
from mstar.server.messages import EngineStats, NodeKV, Stats


class FakeEngine:
    def __init__(self) -> None:
        self.snapshot = {
            "waiting": 1, "running": 2, "steps": 30, "preemptions": 4, "last_batch_size": 2, "requests": 7,
            "kv": {"lm": {"used_blocks": 5, "total_blocks": 64}},
        }
        self.calls = 0

    def stats(self) -> dict:
        self.calls += 1
        return {**self.snapshot}


def test_snapshot_to_wire():
    engine = FakeEngine()
    assert engine_stats(engine) == EngineStats(1, 2, 2, [NodeKV("lm", 5, 64)], 30, 4, 7)
    engine.snapshot["running"] = 0  # an idle engine has no batch, whatever ran last
    assert engine_stats(engine).batch_size == 0


def test_reporter_sends_changes_only_and_stops():
    engine = FakeEngine()
    sent: list[Stats] = []
    changed = threading.Event()

    def emit(report: Stats) -> None:
        sent.append(report)
        changed.set()

    reporter = StatsReporter("0", engine, emit, 0.01)
    reporter.start()
    assert changed.wait(5)
    while engine.calls < 5:
        time.sleep(0.01)
    assert len(sent) == 1 and sent[0] == Stats("0", engine_stats(FakeEngine()))
    changed.clear()
    engine.snapshot["steps"] = 31
    assert changed.wait(5) and sent[-1].stats.steps == 31
    reporter.stop()
    calls = engine.calls
    time.sleep(0.05)
    assert engine.calls == calls and reporter.last is not None
