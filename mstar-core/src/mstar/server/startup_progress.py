"""A progress bar over ``mstar serve``'s start-up: engine processes ready, then warm-up.

Shown only on a terminal (tqdm's ``disable=None``), so logs and tests stay clean.
"""

from __future__ import annotations

import sys


class StartupProgress:
    def __init__(self, engines: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=engines + 1, desc="starting engines", unit="step", file=sys.stderr, disable=None, leave=False)

    def engine_ready(self, name: str) -> None:
        self.bar.set_postfix_str(f"engine {name} ready", refresh=False)
        self.bar.update(1)

    def warming_up(self) -> None:
        self.bar.set_description("warming up")

    def done(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()
