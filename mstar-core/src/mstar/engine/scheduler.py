"""The scheduler: which requests run, which rows are ready, and how a batch is cut.

It admits waiting requests into free slots, finds the steps whose inputs are ready and
groups them by (node, walk) — or by a ``MixedBatchConfig``'s merged walk —, and builds one
batch under the token budget: chunked prefill, KV blocks reserved per row, and when blocks
run out a request is preempted (its blocks freed; ``KVHistory`` recomputes them later),
never a crash. What a request's rows produce is the executor's business (``EngineCore``).
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import torch

from mstar.attention.cross import CROSS_STREAM
from mstar.engine.errors import classify_error
from mstar.engine.executors import LoadedNode, Row, cross_states
from mstar.engine.kv_history import KVHistory
from mstar.engine.request import PreparedStep, Request, RequestStatus, step_key
from mstar.engine.scheduling_policy import FairOldestFirst, SchedulingPolicy
from mstar.engine.walk_cursor import WalkCursor
from mstar.graph import EngineKind, GraphSpec, Step
from mstar.model.spec import MixedBatchConfig
from mstar.model.submodule_base import STOP_ALL, CurrentForwardPassInfo

log = logging.getLogger(__name__)

GroupKey = tuple[str, str]  # (node, walk or merged walk)


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    chunked_prefill: bool = True
    mixed_batches: bool = True
    overlap_nodes: bool = False  # run a second node's batch concurrently (e.g. LM + codec)


@dataclass
class StepCounters:
    """What the engine's loop counted since it started (``EngineCore.stats``); the server's
    wire snapshot of an engine is ``mstar.server.messages.EngineStats``."""

    steps: int = 0
    forwards_by_group: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    preemptions: int = 0
    last_batch_size: int = 0
    walks_completed: set[str] = field(default_factory=set)
    prefix_hit_tokens: int = 0  # prompt positions taken from the prefix cache, not computed


@dataclass
class ReadyStep:
    req: Request
    partition: str
    step: Step
    walk: str
    ready_since: int


class RequestLifecycle(Protocol):
    """What the scheduler asks of the engine when building a batch ends a request's work."""

    def fail(self, req: Request, exc: BaseException, error_type: str | None = None) -> None: ...

    def stop_partition(self, req: Request, partition: str) -> None: ...

    def cursor_moved(self, req: Request, partition: str) -> None: ...


class Scheduler:
    def __init__(
        self,
        graph: GraphSpec,
        nodes: dict[str, LoadedNode],
        config: SchedulerConfig,
        mixed_batch_configs: list[MixedBatchConfig] | None,
        policy: SchedulingPolicy | None,
        stats: StepCounters,
        lifecycle: RequestLifecycle,
    ) -> None:
        self.graph = graph
        self.nodes = nodes
        self.config = config
        self.policy = policy or FairOldestFirst()
        self.stats = stats
        self.lifecycle = lifecycle
        self.waiting: list[Request] = []
        self.running: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._free_slots = list(range(config.max_num_seqs))
        self._merged: dict[tuple[str, str], MixedBatchConfig] = {}
        if config.mixed_batches:
            for mb in mixed_batch_configs or ():
                for w in mb.walks:
                    self._merged[(mb.node, w)] = mb
        self._chunk_inputs = {
            s.stream.chunk_signal: name for name, s in graph.stream_edges().items() if s.stream
        }
        self._context_inputs = {  # present only with some chunks: never waited on
            extra: name
            for name, s in graph.stream_edges().items()
            if s.stream
            for extra in (s.stream.context_signal, s.stream.past_end_signal)
            if extra
        }
        self._iteration = 0

    # ---- requests -------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.arrival = next(self._arrivals)
        self.waiting.append(req)

    def find(self, request_id: str) -> Request | None:
        return self.running.get(request_id) or next((r for r in self.waiting if r.id == request_id), None)

    def next_admission(self) -> tuple[Request, int | None] | None:
        """The next waiting request and the slot it takes (None: it was aborted while it
        waited), or None when nothing can be admitted."""
        if not self.waiting or not self._free_slots:
            return None
        req = self.waiting.pop(0)
        if req.aborted:
            return req, None
        slot = self._free_slots.pop(0)
        req.status = RequestStatus.RUNNING
        self.running[req.id] = req
        return req, slot

    def release(self, req: Request, slot: int | None) -> None:
        self.running.pop(req.id, None)
        if slot is not None:
            self._free_slots.append(slot)
            self._free_slots.sort()

    # ---- ready steps and batches ----------------------------------------------------
    def ready_groups(self) -> dict[Hashable, list[ReadyStep]]:
        self._iteration += 1
        return self._ready_groups()

    def pick_groups(self, groups: dict[Hashable, list[ReadyStep]]) -> list[Hashable]:
        """The group to run, and with ``overlap_nodes`` a second one on another node."""
        key = self.policy.pick_group(groups)
        keys = [key]
        others = {k: v for k, v in groups.items() if k[0] != key[0]}  # type: ignore[index]
        if self.config.overlap_nodes and others:
            keys.append(self.policy.pick_group(others))
        return keys

    def build_batch(self, key: Hashable, ready: list[ReadyStep]) -> tuple[LoadedNode, str, list[Row]]:
        node_name, group_walk = key  # type: ignore[misc]
        node = self.nodes[node_name]
        return node, group_walk, self._build_rows(node, group_walk, self.policy.order_rows(ready))

    def _ready_groups(self) -> dict[Hashable, list[ReadyStep]]:
        groups: dict[Hashable, list[ReadyStep]] = defaultdict(list)
        for req in list(self.running.values()):
            for partition, cursor in req.cursors.items():
                for step in list(cursor.pending):
                    if not self._inputs_ready(req, partition, cursor, step):
                        continue
                    key = step_key(partition, step)
                    since = req.ready_since.setdefault(key, self._iteration)
                    walk = cursor.walk
                    assert walk is not None
                    mb = self._merged.get((step.node, walk))
                    gkey = (step.node, mb.merged_walk if mb else walk)
                    groups[gkey].append(ReadyStep(req, partition, step, walk, since))
        return groups


    def _inputs_ready(self, req: Request, partition: str, cursor: WalkCursor, step: Step) -> bool:
        if step_key(partition, step) in req.prepared:
            return True
        for name in step.inputs:
            stream = self._chunk_inputs.get(name)
            if stream is not None:
                buf = req.streams[stream]
                if buf.next_chunk() is None:
                    if buf.drained:  # nothing will come: end the loop waiting on it
                        loop = cursor.loop_of(step)
                        cursor.stop({loop} if loop else {STOP_ALL})
                        cursor.step_done(step)
                        self.lifecycle.cursor_moved(req, partition)
                    return False
            elif name not in self._context_inputs and name not in req.signals:
                return False
        return True


    def _build_rows(self, node: LoadedNode, group_walk: str, ready: list[ReadyStep]) -> list[Row]:
        rows: list[Row] = []
        budget = self.config.max_num_batched_tokens
        max_bs = node.submodule.max_batch_size(group_walk) or self.config.max_num_seqs
        per_walk: dict[str, int] = defaultdict(int)
        mb = self._merged.get((node.name, ready[0].walk))
        # A walk's row cap keeps the other walks' rows at their pace; with no other walk
        # ready (e.g. a burst of prefills and nothing decoding yet) it would only cost forwards.
        caps = mb.max_rows if mb and len({r.walk for r in ready}) > 1 else {}
        for r in ready:
            if len(rows) >= max_bs:
                break
            if r.req.aborted or r.req.status is not RequestStatus.RUNNING:
                continue
            if caps.get(r.walk) is not None and per_walk[r.walk] >= caps[r.walk]:
                continue
            try:
                prepared = self._prepare(node, r)
            except Exception as exc:
                self.lifecycle.fail(r.req, exc, classify_error(exc, "prepare"))
                continue
            if node.kind is EngineKind.STATELESS:
                rows.append(Row(r.req, r.partition, r.step, r.walk, prepared, prepared.inputs, 0, False, True))
                per_walk[r.walk] += 1
                continue
            row = self._kv_row(node, r, prepared, budget, rows)
            if row is None:
                if budget <= 0:
                    break
                continue
            rows.append(row)
            per_walk[r.walk] += 1
            budget -= row.num_tokens
            if budget <= 0:
                break
        return rows


    def _prepare(self, node: LoadedNode, r: ReadyStep) -> PreparedStep:
        key = step_key(r.partition, r.step)
        prepared = r.req.prepared.get(key)
        if prepared is not None:
            return prepared
        cursor = r.req.cursors[r.partition]
        # A step's stream chunks join the request's signals in a copy; without any (most
        # steps) the plugin reads the signals themselves, through a read-only view.
        chunked: dict[str, torch.Tensor] = {}
        ends: dict[str, int] = {}
        for name in r.step.inputs:
            stream = self._chunk_inputs.get(name)
            if stream is not None:
                chunk = r.req.streams[stream].next_chunk()
                assert chunk is not None
                window, context, end = chunk
                chunked[name] = window
                ends[stream] = end
                edge = self.graph.signals[stream].stream
                assert edge is not None
                if edge.context_signal:
                    chunked[edge.context_signal] = torch.tensor(context)
                if edge.past_end_signal and r.req.streams[stream].is_past_end:
                    chunked[edge.past_end_signal] = torch.tensor(r.req.streams[stream].past_end)
        signals: Mapping[str, torch.Tensor] = (
            {**r.req.signals, **chunked} if chunked else MappingProxyType(r.req.signals)
        )
        main = r.req.sampling.get(node.name)
        info = CurrentForwardPassInfo(
            request_id=r.req.id,
            walk=r.walk,
            request_kwargs=r.req.kwargs,
            num_computed_tokens=node.kv.num_tokens(r.req.id, "main") if node.kv else 0,
            iteration=cursor.iteration(r.step),
            num_generated=r.req.num_generated.get(node.name, 0),
            sampling=main.main if main is not None else None,
        )
        inputs = node.submodule.prepare_inputs(r.walk, info, signals)
        inputs.graph_walk = r.walk
        prepared = PreparedStep(inputs, info, ends)
        if node.kv is not None and node.kv.prefix_cache is not None:
            prepared.cache_keys = node.submodule.prefix_cache_keys(r.walk, info, inputs)  # type: ignore[attr-defined]
        elif node.output_cache is not None:
            prepared.output_key = node.submodule.output_cache_key(r.walk, info, inputs)
        r.req.prepared[key] = prepared
        return prepared


    def _kv_row(
        self, node: LoadedNode, r: ReadyStep, prepared: PreparedStep, budget: int, rows: list[Row]
    ) -> Row | None:
        assert node.kv is not None
        req = r.req
        replay = node.name in req.needs_replay
        cached = node.kv.num_tokens(req.id, "main")
        if replay:  # recompute the preempted cache first, exactly as it was fed
            history = req.kv_history[node.name]
            start, total = cached, history.length
        else:
            if cached == 0 and prepared.done == 0 and prepared.cache_keys is not None:
                cached = self._map_cached_prefix(node, r, prepared)
            start, total = prepared.done, prepared.total
        remaining = total - start
        n = min(remaining, budget) if self.config.chunked_prefill else remaining
        if n <= 0 or (n < remaining and not self.config.chunked_prefill):
            return None
        unit = node.chunk_unit
        if unit > 1 and n < remaining:  # a cut chunk ends on a unit boundary
            aligned = (cached + n) // unit * unit - cached
            if aligned <= 0:
                if rows:  # the budget left this step holds no whole unit: next step
                    return None
                aligned = min(remaining, unit - cached % unit)  # one unit, over budget, to progress
            n = aligned
        if cached + n > node.max_model_len:
            if cached == 0 or not req.num_generated.get(node.name):
                self.lifecycle.fail(req, ValueError(
                    f"input of {cached + remaining} positions exceeds the model's maximum length of "
                    f"{node.max_model_len}"
                ), "too_large")
            else:
                req.finish_reason = req.finish_reason or "length"
                self.lifecycle.stop_partition(req, r.partition)
            return None
        if replay:
            chunk = history.replay_chunk(start, n, node.submodule.split_inputs)
            n = chunk.input_seq_len
        elif start == 0 and n == total:  # the whole step in one forward: nothing to split
            chunk = prepared.inputs
        else:
            chunk = node.submodule.split_inputs(r.walk, prepared.info, prepared.inputs, start, start + n)  # type: ignore[arg-type]
        # An encoder–decoder node's first forward for the request (also the first replayed one
        # after preemption, which freed it) writes its cross-attention cache: reserve it first.
        cross_write = node.cross_signal is not None and cached == 0
        if cross_write and node.kv.num_tokens(req.id, CROSS_STREAM) == 0:
            try:
                positions = cross_states(req.signals, node.cross_signal).shape[0]  # type: ignore[arg-type]
            except ValueError as exc:
                self.lifecycle.fail(req, exc, "invalid_request")
                return None
            if not self._reserve(node, req, positions, rows, CROSS_STREAM):
                return None
        if not self._reserve(node, req, n, rows):
            return None
        completes = not replay and start + n == total
        prepared.info.num_computed_tokens = cached
        prepared.info.is_last_chunk = completes
        return Row(req, r.partition, r.step, r.walk, prepared, chunk, n, replay, completes, cached + n,
                   cross_write=cross_write)


    def _map_cached_prefix(self, node: LoadedNode, r: ReadyStep, prepared: PreparedStep) -> int:
        """A request's first step on a node with prefix caching: the cached blocks of its
        longest cached prefix become its own (shared), and only the rest is computed. At
        least one position is left to compute, as the step's outputs need its forward."""
        assert node.kv is not None and prepared.cache_keys is not None
        if node.chunk_unit > 1 or node.cross_signal is not None:
            # Whole blocks need not end on the node's chunk unit; a cross-attending node's
            # positions depend on its encoder states too, which the keys do not name.
            return 0
        hit = node.kv.map_prefix(r.req.id, "main", prepared.cache_keys, prepared.total - 1)
        if hit:
            prepared.done = hit
            # A preempted request recomputes these positions from its history like the rest.
            r.req.kv_history.setdefault(node.name, KVHistory()).record(
                r.walk, prepared.info, prepared.inputs, 0, hit, prepared.cache_keys  # type: ignore[arg-type]
            )
            self.stats.prefix_hit_tokens += hit
        return hit

    def _reserve(self, node: LoadedNode, req: Request, n: int, rows: list[Row], stream: str = "main") -> bool:
        assert node.kv is not None
        while not node.kv.append(req.id, stream, n):
            in_batch = {row.req.id for row in rows} | {req.id}
            holders = [
                q for q in self.running.values()
                if q.id not in in_batch and node.kv.num_tokens(q.id, "main") > 0
            ]
            if not holders:
                if not rows:
                    needed = sum(node.kv.num_tokens(req.id, name) for name in node.kv.streams(req.id)) + n
                    self.lifecycle.fail(req, MemoryError(
                        f"request needs {needed} cache positions on node {node.name!r}; the KV "
                        f"pool holds {node.kv.num_blocks * node.kv.block_size}"
                    ), "too_large")
                return False
            self._preempt(node, self.policy.preemption_victim(holders))
        return True


    def _preempt(self, node: LoadedNode, victim: Request) -> None:
        assert node.kv is not None
        node.kv.free_request(victim.id)
        history = victim.kv_history.get(node.name)
        if history is not None and history.length:
            victim.needs_replay.add(node.name)
        self.stats.preemptions += 1
        log.debug("preempted %s on %s", victim.id, node.name)
