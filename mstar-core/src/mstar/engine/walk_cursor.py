"""A request's position inside its current walk of one partition.

The walk body is run as a generator that yields the steps ready to run next (one, or
several for a ``Parallel``); the engine resumes it once they all ran.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping

from mstar.graph import GraphSpec, Loop, Parallel, Sequential, Step
from mstar.graph.spec import WalkPart
from mstar.model.submodule_base import STOP_ALL


class WalkCursor:
    def __init__(
        self,
        graph: GraphSpec,
        partition: str,
        request_kwargs: Mapping,
        stream_drained: Callable[[str], bool],
    ) -> None:
        self.graph = graph
        self.partition = partition
        self.request_kwargs = request_kwargs
        self._stream_drained = stream_drained
        self.walk: str | None = graph.state_machine.first_walk(partition, request_kwargs)
        self.pending: list[Step] = []
        self.loop_iters: dict[str, int] = {}
        self._stops: set[str] = set()
        self._gen: Generator[tuple[Step, ...], None, None] | None = None
        self.finished_walks: list[str] = []
        self._start_walk()

    @property
    def done(self) -> bool:
        return self.walk is None

    def stop(self, names: set[str] | frozenset[str]) -> None:
        self._stops.update(names)

    def step_done(self, step: Step) -> None:
        """Mark a pending step as run; advance when the whole group ran."""
        self.pending.remove(step)
        if not self.pending:
            self._advance()

    def iteration(self, step: Step) -> int:
        return self.loop_iters.get(self._loop_of.get(id(step), ""), 0)

    def loop_of(self, step: Step) -> str | None:
        return self._loop_of.get(id(step))

    def pop_finished_walks(self) -> list[str]:
        done, self.finished_walks = self.finished_walks, []
        return done

    def _start_walk(self) -> None:
        while self.walk is not None:
            self._loop_of: dict[int, str] = {}
            self._gen = self._run(self.graph.walks[self.walk].body, None)
            self._advance_gen()
            if self.pending or self.walk is None:
                return

    def _advance(self) -> None:
        self._advance_gen()
        if not self.pending and self.walk is not None:
            self._start_walk()

    def _advance_gen(self) -> None:
        assert self._gen is not None
        if STOP_ALL in self._stops:
            self.walk = None
            self.pending = []
            return
        try:
            self.pending = list(next(self._gen))
        except StopIteration:
            self.pending = []
            finished = self.walk
            assert finished is not None
            self.finished_walks.append(finished)
            self.walk = self.graph.state_machine.next_walk(self.partition, finished, self.request_kwargs)

    def _run(self, part: WalkPart, loop: str | None) -> Generator[tuple[Step, ...], None, None]:
        if isinstance(part, Step):
            if loop is not None:
                self._loop_of[id(part)] = loop
            yield (part,)
        elif isinstance(part, Parallel):
            for p in part.parts:
                if loop is not None:
                    self._loop_of[id(p)] = loop
            yield tuple(part.parts)
        elif isinstance(part, Sequential):
            for p in part.parts:
                yield from self._run(p, loop)
                if STOP_ALL in self._stops:
                    return
        elif isinstance(part, Loop):
            self.loop_iters[part.name] = 0
            while True:
                if part.until_stream_closed and self._stream_drained(part.until_stream_closed):
                    break
                yield from self._run(part.body, part.name)
                self.loop_iters[part.name] += 1
                if part.name in self._stops or STOP_ALL in self._stops:
                    self._stops.discard(part.name)
                    break
                if part.max_iters is not None and self.loop_iters[part.name] >= part.max_iters:
                    break
