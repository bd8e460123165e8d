"""The engine's step loop: admit requests, find ready rows, batch one group, run it, route.

One ``step()`` runs one forward of one node over a batch of rows that stand at the same
(node, walk) — or at several walks merged by a ``MixedBatchConfig``. KV rows are cut to a
token budget (chunked prefill) and get their cache blocks here; when blocks run out a
request is preempted (its blocks freed, its cache recomputed later), never a crash.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from mstar.engine.executors import LoadedNode, NodeExecutionError, Row
from mstar.engine.kv_history import KVHistory
from mstar.engine.request import PreparedStep, Request, RequestOutput, RequestStatus, step_key
from mstar.engine.scheduling_policy import FairOldestFirst, SchedulingPolicy
from mstar.engine.stop_rules import merge as merge_stop_checks
from mstar.engine.stream_buffer import StreamBuffer
from mstar.engine.walk_cursor import WalkCursor
from mstar.graph import EngineKind, GraphSpec, Step
from mstar.graph.spec import iter_steps
from mstar.model.spec import MixedBatchConfig
from mstar.model.submodule_base import (
    STOP_ALL,
    CurrentForwardPassInfo,
    StopCheck,
)

log = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    chunked_prefill: bool = True
    mixed_batches: bool = True
    overlap_nodes: bool = False  # run a second node's batch concurrently (e.g. LM + codec)


@dataclass
class EngineStats:
    steps: int = 0
    forwards_by_group: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    preemptions: int = 0
    last_batch_size: int = 0
    walks_completed: set[str] = field(default_factory=set)


@dataclass
class _Ready:
    req: Request
    partition: str
    step: Step
    walk: str
    ready_since: int


class EngineCore:
    def __init__(
        self,
        graph: GraphSpec,
        nodes: dict[str, LoadedNode],
        scheduler: SchedulerConfig | None = None,
        mixed_batch_configs: list[MixedBatchConfig] | None = None,
        policy: SchedulingPolicy | None = None,
    ) -> None:
        self.graph = graph
        self.nodes = nodes
        self.config = scheduler or SchedulerConfig()
        self.policy = policy or FairOldestFirst()
        self.stats = EngineStats()
        self._merged: dict[tuple[str, str], MixedBatchConfig] = {}
        if self.config.mixed_batches:
            for mb in mixed_batch_configs or ():
                for w in mb.walks:
                    self._merged[(mb.node, w)] = mb
        self.waiting: list[Request] = []
        self.running: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._iteration = 0
        self._outputs: list[RequestOutput] = []
        self._stream_producers = self._find_stream_producers()
        self._chunk_inputs = {
            s.stream.chunk_signal: name for name, s in graph.stream_edges().items() if s.stream
        }
        self._context_inputs = {
            s.stream.context_signal: name
            for name, s in graph.stream_edges().items()
            if s.stream and s.stream.context_signal
        }
        self._walk_signals = {
            w: {o for st in iter_steps(walk.body) for o in st.outputs} for w, walk in graph.walks.items()
        }
        self._free_slots = list(range(self.config.max_num_seqs))
        self._overlap_pool: ThreadPoolExecutor | None = None
        self.idle = False
        # Partitions run here only when all their nodes are placed here; streams from or
        # into other partitions cross processes through push_stream / stream events.
        self.local_partitions = tuple(
            p for p in graph.partitions
            if all(s.node in nodes for w in graph.walks.values() if w.partition == p for s in iter_steps(w.body))
        )
        self._remote_consumers = {
            name for name, s in graph.stream_edges().items()
            if s.stream and s.stream.into_partition not in self.local_partitions
        }

    # ---- requests -------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        req.arrival = next(self._arrivals)
        for name, sig in self.graph.stream_edges().items():
            assert sig.stream is not None
            req.streams[name] = StreamBuffer(sig.stream.policy)
        self.waiting.append(req)

    def _find(self, request_id: str) -> Request | None:
        return self.running.get(request_id) or next((r for r in self.waiting if r.id == request_id), None)

    def push_stream(self, request_id: str, signal: str, value: torch.Tensor) -> None:
        """An item of a stream produced in another process."""
        req = self._find(request_id)
        if req is not None:
            req.streams[signal].append(value)

    def close_stream(self, request_id: str, signal: str) -> None:
        req = self._find(request_id)
        if req is not None:
            req.streams[signal].closed = True

    def abort(self, request_id: str) -> None:
        req = self._find(request_id)
        if req is not None:
            req.aborted = True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the loop -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        self._iteration += 1
        self._reap_aborted()
        self._admit()
        groups = self._ready_groups()
        self.idle = not groups  # nothing could run: only new input can change that
        if groups:
            key = self.policy.pick_group(groups)
            keys = [key]
            others = {k: v for k, v in groups.items() if k[0] != key[0]}  # type: ignore[index]
            if self.config.overlap_nodes and others:
                keys.append(self.policy.pick_group(others))
            self._run_groups([(k, groups[k]) for k in keys])
        self._finish_done_requests()
        out, self._outputs = self._outputs, []
        return out

    def _admit(self) -> None:
        while self.waiting and self._free_slots:
            req = self.waiting.pop(0)
            if req.aborted:
                self._emit(RequestOutput(req.id, finished=True, finish_reason="abort"))
                continue
            slot = self._free_slots.pop(0)
            try:
                self._start(req, slot)
            except Exception as exc:  # bad request: fails alone
                self._fail(req, exc)

    def _start(self, req: Request, slot: int) -> None:
        req.status = RequestStatus.RUNNING
        self.running[req.id] = req
        req.slots = {"__slot__": slot}
        req.signals = dict(req.inputs)
        for node_name, node in self.nodes.items():
            if node.sampler is None:
                continue
            cfg = req.sampling.get(node_name)
            assert node.sampler_decl is not None
            prompt = None
            if node.sampler_decl.prompt_signal:
                prompt = req.inputs[node.sampler_decl.prompt_signal].reshape(-1).tolist()
            node.sampler.add_request(slot, cfg, prompt or (), list(node.sampler_decl.stop_token_ids))
            req.slots[node_name] = slot
        for partition in self.local_partitions:
            req.cursors[partition] = WalkCursor(
                self.graph, partition, req.kwargs, lambda s, r=req: r.streams[s].drained
            )
        self._close_finished_streams(req)

    def _ready_groups(self) -> dict[Hashable, list[_Ready]]:
        groups: dict[Hashable, list[_Ready]] = defaultdict(list)
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
                    groups[gkey].append(_Ready(req, partition, step, walk, since))
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
                        self._after_cursor_moved(req, partition)
                    return False
            elif name not in self._context_inputs and name not in req.signals:
                return False
        return True

    # ---- running a group ------------------------------------------------------------
    def _run_groups(self, picked: list[tuple[Hashable, list[_Ready]]]) -> None:
        """Run the picked groups; a second group (always on another node) runs on a worker
        thread while the first runs here, so e.g. a codec overlaps the LM. Rows are built
        and completed one group after the other, on this thread."""
        plans = []
        for key, ready in picked:
            node_name, group_walk = key  # type: ignore[misc]
            node = self.nodes[node_name]
            rows = self._build_rows(node, group_walk, self.policy.order_rows(ready))
            if rows:
                plans.append((node, group_walk, rows))
                self.stats.steps += 1
                self.stats.forwards_by_group[f"{node_name}:{group_walk}"] += 1
                self.stats.last_batch_size = len(rows)
        if len(plans) == 2:
            if self._overlap_pool is None:
                self._overlap_pool = ThreadPoolExecutor(1, thread_name_prefix="mstar-overlap")
            second = self._overlap_pool.submit(_execute, *plans[1])
            results = [_execute(*plans[0]), second.result()]
        else:
            results = [_execute(*plan) for plan in plans]
        for (node, _, rows), res in zip(plans, results, strict=True):
            for row in rows:
                out = res.get(row.req.id)
                if row.req.status is not RequestStatus.RUNNING:
                    continue  # failed while the other group was being built
                if isinstance(out, BaseException):
                    self._fail(row.req, out, "internal")
                elif out is not None:
                    self._complete_row(node, row, out)

    def _build_rows(self, node: LoadedNode, group_walk: str, ready: list[_Ready]) -> list[Row]:
        rows: list[Row] = []
        budget = self.config.max_num_batched_tokens
        max_bs = node.submodule.max_batch_size(group_walk) or self.config.max_num_seqs
        per_walk: dict[str, int] = defaultdict(int)
        mb = self._merged.get((node.name, ready[0].walk))
        for r in ready:
            if len(rows) >= max_bs:
                break
            if r.req.aborted or r.req.status is not RequestStatus.RUNNING:
                continue
            if mb and mb.max_rows.get(r.walk) is not None and per_walk[r.walk] >= mb.max_rows[r.walk]:
                continue
            try:
                prepared = self._prepare(node, r)
            except Exception as exc:
                # prepare_inputs reads the request's own inputs: its ValueErrors are the
                # caller's; anything else is ours.
                self._fail(r.req, exc)
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

    def _prepare(self, node: LoadedNode, r: _Ready) -> PreparedStep:
        key = step_key(r.partition, r.step)
        prepared = r.req.prepared.get(key)
        if prepared is not None:
            return prepared
        cursor = r.req.cursors[r.partition]
        signals = dict(r.req.signals)
        ends: dict[str, int] = {}
        for name in r.step.inputs:
            stream = self._chunk_inputs.get(name)
            if stream is not None:
                chunk = r.req.streams[stream].next_chunk()
                assert chunk is not None
                window, context, end = chunk
                signals[name] = window
                ends[stream] = end
                ctx_name = self.graph.signals[stream].stream.context_signal  # type: ignore[union-attr]
                if ctx_name:
                    signals[ctx_name] = torch.tensor(context)
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
        r.req.prepared[key] = prepared
        return prepared

    def _kv_row(
        self, node: LoadedNode, r: _Ready, prepared: PreparedStep, budget: int, rows: list[Row]
    ) -> Row | None:
        assert node.kv is not None
        req = r.req
        replay = node.name in req.needs_replay
        cached = node.kv.num_tokens(req.id, "main")
        if replay:  # recompute the preempted cache first, exactly as it was fed
            history = req.kv_history[node.name]
            start, total = cached, history.length
        else:
            start, total = prepared.done, prepared.total
        remaining = total - start
        n = min(remaining, budget) if self.config.chunked_prefill else remaining
        if n <= 0 or (n < remaining and not self.config.chunked_prefill):
            return None
        if cached + n > node.max_model_len:
            if cached == 0 or not req.num_generated.get(node.name):
                self._fail(req, ValueError(
                    f"input of {cached + remaining} positions exceeds the model's maximum length of "
                    f"{node.max_model_len}"
                ), "too_large")
            else:
                req.finish_reason = req.finish_reason or "length"
                self._stop_partition(req, r.partition)
            return None
        if replay:
            chunk = history.replay_chunk(start, n, node.submodule.split_inputs)
            n = chunk.input_seq_len
        else:
            chunk = node.submodule.split_inputs(r.walk, prepared.info, prepared.inputs, start, start + n)  # type: ignore[arg-type]
        if not self._reserve(node, req, n, rows):
            return None
        completes = not replay and start + n == total
        prepared.info.num_computed_tokens = cached
        prepared.info.is_last_chunk = completes
        return Row(req, r.partition, r.step, r.walk, prepared, chunk, n, replay, completes)

    def _reserve(self, node: LoadedNode, req: Request, n: int, rows: list[Row]) -> bool:
        assert node.kv is not None
        while not node.kv.append(req.id, "main", n):
            in_batch = {row.req.id for row in rows} | {req.id}
            holders = [
                q for q in self.running.values()
                if q.id not in in_batch and node.kv.num_tokens(q.id, "main") > 0
            ]
            if not holders:
                if not rows:
                    needed = node.kv.num_tokens(req.id, "main") + n
                    self._fail(req, MemoryError(
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

    # ---- after the forward ----------------------------------------------------------
    def _complete_row(self, node: LoadedNode, row: Row, outputs: dict[str, torch.Tensor]) -> None:
        req = row.req
        if node.kind is EngineKind.KV_CACHE:
            assert node.kv is not None
            if row.replay:
                if node.kv.num_tokens(req.id, "main") >= req.kv_history[node.name].length:
                    req.needs_replay.discard(node.name)
                return
            start = row.prepared.done
            req.kv_history.setdefault(node.name, KVHistory()).record(
                row.walk, row.prepared.info, row.prepared.inputs, start, start + row.num_tokens  # type: ignore[arg-type]
            )
            row.prepared.done += row.num_tokens
            if not row.completes:
                return
        key = step_key(row.partition, row.step)
        del req.prepared[key]
        req.ready_since.pop(key, None)
        for stream, end in row.prepared.stream_ends.items():
            req.streams[stream].consume(end)
        info = row.prepared.info
        try:
            node.submodule.postprocess(req.id, info, outputs)
            check = row.stop_check if row.stop_check is not None else node.submodule.check_stop(req.id, info, outputs)
        except Exception as exc:
            self._fail(req, exc, "internal")
            return
        if not isinstance(check, StopCheck):
            check = StopCheck(frozenset(check))
        check = merge_stop_checks(row.core_stop, check)
        req.num_generated[node.name] = req.num_generated.get(node.name, 0) + 1
        self.stats.walks_completed.add(row.walk)
        for name in row.step.outputs:
            if name in outputs and name not in check.withheld:
                self._route(req, name, outputs[name])
        if check.reason and not req.finish_reason:
            req.finish_reason = check.reason
        cursor = req.cursors[row.partition]
        cursor.stop(check.stops)
        cursor.step_done(row.step)
        self._after_cursor_moved(req, row.partition)

    def _route(self, req: Request, name: str, value: torch.Tensor) -> None:
        req.signals[name] = value
        sig = self.graph.signals.get(name)
        if sig is None:
            return
        if sig.to_client:
            self._emit(RequestOutput(req.id, signal=name, data=value))
        if sig.stream is not None:
            if name in self._remote_consumers:
                self._emit(RequestOutput(req.id, signal=name, data=value, stream_item=True))
            else:
                req.streams[name].append(value)

    def _after_cursor_moved(self, req: Request, partition: str) -> None:
        cursor = req.cursors[partition]
        for walk in cursor.pop_finished_walks():
            for name in self._walk_signals[walk]:
                sig = self.graph.signals.get(name)
                if sig is not None and not sig.persist:
                    req.signals.pop(name, None)
        if cursor.done:
            self._close_finished_streams(req)

    def _stop_partition(self, req: Request, partition: str) -> None:
        cursor = req.cursors[partition]
        for key in [k for k in req.prepared if k[0] == partition]:
            del req.prepared[key]
        cursor.stop({STOP_ALL})
        if cursor.pending:
            cursor.step_done(cursor.pending[0])
        self._after_cursor_moved(req, partition)

    def _close_finished_streams(self, req: Request) -> None:
        for stream, producers in self._stream_producers.items():
            buf = req.streams[stream]
            if buf.closed or not producers <= req.cursors.keys():
                continue  # already closed, or produced in another process
            if all(req.cursors[p].done for p in producers):
                buf.closed = True
                if stream in self._remote_consumers:
                    self._emit(RequestOutput(req.id, signal=stream, stream_closed=True))

    def _find_stream_producers(self) -> dict[str, set[str]]:
        producers: dict[str, set[str]] = {}
        for name in self.graph.stream_edges():
            producers[name] = {
                w.partition for w in self.graph.walks.values()
                if any(name in s.outputs for s in iter_steps(w.body))
            }
        return producers

    # ---- leaving --------------------------------------------------------------------
    def _finish_done_requests(self) -> None:
        for req in list(self.running.values()):
            if all(c.done for c in req.cursors.values()):
                self._emit(RequestOutput(req.id, finished=True, finish_reason=req.finish_reason or "stop"))
                self._release(req)

    def _reap_aborted(self) -> None:
        for req in list(self.running.values()):
            if req.aborted:
                self._emit(RequestOutput(req.id, finished=True, finish_reason="abort"))
                self._release(req)

    def _fail(self, req: Request, exc: BaseException, error_type: str | None = None) -> None:
        req.error = f"{type(exc).__name__}: {exc}"
        log.info("request %s failed: %s", req.id, req.error)
        kind = error_type or _error_type(exc)
        self._emit(RequestOutput(req.id, finished=True, finish_reason="error", error=req.error, error_type=kind))
        if req.id in self.running:
            self._release(req)

    def _release(self, req: Request) -> None:
        req.status = RequestStatus.FINISHED
        self.running.pop(req.id, None)
        for node in self.nodes.values():
            if node.kv is not None:
                node.kv.free_request(req.id)
            if node.sampler is not None and node.name in req.slots:
                node.sampler.remove_request(req.slots[node.name])
            node.submodule.cleanup_request(req.id)
        if "__slot__" in req.slots:
            self._free_slots.append(req.slots.pop("__slot__"))
            self._free_slots.sort()
        req.states.clear()
        req.prepared.clear()
        req.kv_history.clear()
        req.slots.clear()

    def _emit(self, out: RequestOutput) -> None:
        self._outputs.append(out)


def _execute(node: LoadedNode, walk: str, rows: list[Row]) -> dict[str, object]:
    try:
        return node.executor.run(walk, rows)
    except NodeExecutionError as exc:
        return exc.partial


def _error_type(exc: BaseException) -> str:
    """Input errors (a model's prepare_inputs or the sampler rejecting the request's own
    values) are the caller's; everything else is an internal error."""
    return "invalid_request" if isinstance(exc, ValueError | TypeError | KeyError | IndexError) else "internal"
