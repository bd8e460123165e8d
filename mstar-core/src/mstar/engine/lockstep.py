"""The ranks of a tensor-parallel engine step together.

Rank 0's engine is the one requests reach; the others follow it. Before each of its steps
rank 0 sends the commands it applied since the last one (requests added, aborts, stream
items) and whether it steps; every follower applies the same commands to its own core and
steps with it. Given the same commands, the cores decide the same (scheduling, preemption,
KV blocks: their pools hold the same number of blocks) and their samplers draw the same
tokens from the same seeds over the same gathered logits, so only the layers' collectives
cross between ranks during a step. Followers' outputs are dropped.
"""

from __future__ import annotations

import pickle
from typing import Any

from mstar.parallel.group import TensorParallelGroup

STOP = "stop"


class LockstepLeader:
    def __init__(self, tp: TensorParallelGroup) -> None:
        self.tp = tp
        self.pending: list[tuple[str, bytes]] = []

    def record(self, name: str, *args: Any) -> None:
        """A command the leader's core just applied (pickled now: the core changes its objects)."""
        self.pending.append((name, pickle.dumps(args)))

    def before_step(self, stepping: bool) -> None:
        if self.pending or stepping:
            commands, self.pending = self.pending, []
            self.tp.broadcast_object((commands, stepping))

    def stop(self) -> None:
        self.tp.broadcast_object(STOP)


def follow(core: Any, tp: TensorParallelGroup) -> int:
    """A follower's loop: apply rank 0's commands, step when it steps; returns the forwards
    it ran (``core.stats.steps``, as rank 0 counts them) once rank 0 stops."""
    start = core.stats.steps
    while True:
        message = tp.broadcast_object()
        if message == STOP:
            return core.stats.steps - start
        commands, stepping = message
        for name, args in commands:
            getattr(core, name)(*pickle.loads(args))
        if stepping:
            core.step()
