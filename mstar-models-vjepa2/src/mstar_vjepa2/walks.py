"""The walk choice of both models: the request's ``task`` kwarg picks a fixed sequence.
``VJEPA2_TASKS`` and ``VJEPA2AC_TASKS`` are each model's tasks (its graph's state machine;
its adapter checks a request's task against them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskWalks:
    """``tasks``: task name → walks in order (one partition). An unknown task runs the
    default task's first walk, whose node rejects the request (see ``check_task``)."""

    partition: str
    tasks: Mapping[str, tuple[str, ...]]
    default: str

    def _order(self, kwargs: Mapping) -> tuple[str, ...]:
        return self.tasks.get(str(kwargs.get("task", self.default)), self.tasks[self.default])

    def first_walk(self, partition: str, request_kwargs: Mapping) -> str | None:
        return self._order(request_kwargs)[0] if partition == self.partition else None

    def next_walk(self, partition: str, finished_walk: str, request_kwargs: Mapping) -> str | None:
        order = self._order(request_kwargs)
        i = order.index(finished_walk)
        return order[i + 1] if i + 1 < len(order) else None

    def walks(self) -> set[str]:
        return {w for ws in self.tasks.values() for w in ws}

    def check_task(self, request_kwargs: Mapping) -> str:
        task = str(request_kwargs.get("task", self.default))
        if task not in self.tasks:
            raise ValueError(f"task: unknown task {task!r}; choose one of {sorted(self.tasks)}")
        return task


VJEPA2_TASKS = TaskWalks(
    "main", {"encode": ("encode",), "predict": ("encode", "predict"), "anticipate": ("encode", "anticipate")},
    default="encode",
)
# "*_latents" tasks start from given latents (a previous encode) instead of a video.
VJEPA2AC_TASKS = TaskWalks(
    "main", {"encode": ("encode",), "rollout": ("encode", "rollout"), "plan": ("encode", "plan"),
             "rollout_latents": ("rollout",), "plan_latents": ("plan",)},
    default="rollout",
)
