"""A second node's batch on a worker thread, running across the engine's steps.

With ``overlap_nodes`` the engine hands one batch at a time to this worker (e.g. a codec
call) and goes on stepping the other nodes (e.g. the LM) on its own thread until the
worker is done; it waits for the worker only when nothing else can run, or when the batch
holds a stream's first chunk (a request's first audio: ``EngineCore._run_groups``). Before
such a wait, if the worker's node allows concurrent forwards
(``NodeSubmodule.concurrent_forwards``), the engine's thread first runs that node's next
batch itself, from requests the worker does not hold; and when that node's rows are all
there is to run and they fill more than one batch, the idle worker takes one and the
engine's thread the next, so both cores decode. Only the
forward runs on the worker: the engine builds the batch before and completes its rows
after, on its own thread, so requests, streams and caches change on one thread only.

A request whose batch is on the worker may still fail or be aborted meanwhile: it leaves
the scheduler at once, but what the worker may still touch (cache blocks, sampler slot,
per-request state) is freed only once the worker has finished (``deferred``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mstar.engine.executors import LoadedNode, Row
    from mstar.engine.request import Request


@dataclass
class InFlight:
    node: LoadedNode
    walk: str
    rows: list[Row]
    future: Future
    request_ids: frozenset[str]
    deferred: list[Request] = field(default_factory=list)


class OverlapWorker:
    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads  # torch threads of the worker thread (None: as it starts)
        self._pool: ThreadPoolExecutor | None = None
        self.inflight: InFlight | None = None
        self.batches = 0  # batches run on the worker so far

    @property
    def busy_node(self) -> str | None:
        return None if self.inflight is None else self.inflight.node.name

    def holds(self, request_id: str) -> bool:
        return self.inflight is not None and request_id in self.inflight.request_ids

    def defer(self, req: Request) -> bool:
        """Keep ``req``'s resources until the batch on the worker returns, if it holds the
        request; whether it did."""
        if self.inflight is None or req.id not in self.inflight.request_ids:
            return False
        self.inflight.deferred.append(req)
        return True

    def submit(self, run: Callable[..., dict], node: LoadedNode, walk: str, rows: list[Row]) -> None:
        assert self.inflight is None, "one batch at a time on the worker"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mstar-overlap", initializer=self._start_thread)
        future = self._pool.submit(run, node, walk, rows)
        self.inflight = InFlight(node, walk, rows, future, frozenset(r.req.id for r in rows))
        self.batches += 1

    def _start_thread(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def take(self, wait: bool) -> InFlight | None:
        """The finished batch (its future done), or None: none in flight, or (``wait``
        False) still running."""
        inflight = self.inflight
        if inflight is None or (not wait and not inflight.future.done()):
            return None
        inflight.future.exception()  # waits; a raise surfaces in the caller's .result()
        self.inflight = None
        return inflight
