"""Engine restarts are a rate (issue 33): at most K within any window, with a back-off that
doubles inside the window and falls back once the window is clear."""

from __future__ import annotations

import asyncio

from mstar.server.supervisor import Supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def delays(sup: Supervisor, clock: Clock, deaths: list[float]) -> list[float | None]:
    """The back-off of each death at the given times (None: it stays down)."""
    out: list[float | None] = []

    async def run() -> None:
        for t in deaths:
            clock.now = t
            sup.exited("0", "killed", lambda name: None)
            h = sup._history("0")
            out.append(None if h.restart_at is None else h.restart_at - t)
            sup.ready("0")
        sup.cancel()

    asyncio.run(run())
    return out


def test_restarts_spaced_over_windows_never_run_out():
    clock = Clock()
    sup = Supervisor(True, 2, window_s=60, clock=clock)
    assert delays(sup, clock, [1000 + 100 * i for i in range(10)]) == [1.0] * 10
    assert sup.restarts("0") == 10 and "restart_limit_reached" not in sup.describe("0")


def test_back_off_doubles_inside_the_window_and_a_burst_stays_down():
    clock = Clock()
    sup = Supervisor(True, 3, window_s=60, clock=clock)
    assert delays(sup, clock, [1000, 1005, 1010, 1015]) == [1.0, 2.0, 4.0, None]
    assert sup.describe("0")["restart_limit_reached"] is True


def test_window_zero_is_the_old_lifetime_cap():
    clock = Clock()
    sup = Supervisor(True, 2, window_s=0, clock=clock)
    assert delays(sup, clock, [1000, 5000, 90000]) == [1.0, 2.0, None]
