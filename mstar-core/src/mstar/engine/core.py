"""The executor side of the engine's step loop: one ``step()`` asks the scheduler for a
batch, runs it through the node's executor, and completes each row — stop rules, routing
of output signals (to the client, into streams, to the next walk), and the end of a
request (finished, failed or aborted: every resource freed).

Which rows run and how a batch is cut is ``mstar.engine.scheduler``'s job.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import torch

from mstar.engine.errors import classify_error
from mstar.engine.executors import LOGITS, LoadedNode, NodeExecutionError, Row
from mstar.engine.kv_history import KVHistory
from mstar.engine.overlap import OverlapWorker
from mstar.engine.request import Request, RequestOutput, RequestStatus, step_key
from mstar.engine.scheduler import Scheduler, SchedulerConfig, StepCounters
from mstar.engine.scheduling_policy import SchedulingPolicy
from mstar.engine.stream_buffer import StreamBuffer
from mstar.engine.walk_cursor import WalkCursor
from mstar.graph import EngineKind, GraphSpec
from mstar.graph.spec import iter_steps
from mstar.model.spec import MixedBatchConfig
from mstar.model.submodule_base import STOP_ALL, StopCheck
from mstar.parallel.group import TensorParallelGroup

log = logging.getLogger(__name__)
_GO_ON = StopCheck()

__all__ = ["EngineCore", "StepCounters", "SchedulerConfig"]


class EngineCore:
    def __init__(
        self,
        graph: GraphSpec,
        nodes: dict[str, LoadedNode],
        scheduler: SchedulerConfig | None = None,
        mixed_batch_configs: list[MixedBatchConfig] | None = None,
        policy: SchedulingPolicy | None = None,
        forward_threads: int | None = None,
    ) -> None:
        self.graph = graph
        self.nodes = nodes
        self.config = scheduler or SchedulerConfig()
        self.stats = StepCounters()
        self.scheduler = Scheduler(graph, nodes, self.config, mixed_batch_configs, policy, self.stats, self)
        self._outputs: list[RequestOutput] = []
        self._cursor_ended: dict[str, Request] = {}  # requests with a cursor done since the last step
        self._stream_producers = self._find_stream_producers()
        self._walk_signals = {
            w: {o for st in iter_steps(walk.body) for o in st.outputs} for w, walk in graph.walks.items()
        }
        # torch threads of the threads this engine owns (the step loop pins itself with
        # pin_thread; the overlap worker at its start); None leaves them as they are.
        self.forward_threads = forward_threads
        self.tensor_parallel: TensorParallelGroup | None = None  # set by the builder when N > 1
        for node in nodes.values():  # NodeSubmodule.slot_states: one row per admission slot
            node.slot_states = {
                name: torch.zeros((self.config.max_num_seqs, *spec.shape), dtype=spec.dtype, device=node.device)
                for name, spec in node.submodule.slot_states().items()
            }
        self.overlap = OverlapWorker(forward_threads)
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

    def pin_thread(self) -> None:
        """Give the calling thread (the engine's own loop) ``forward_threads`` torch threads."""
        if self.forward_threads is not None:
            torch.set_num_threads(self.forward_threads)

    @property
    def waiting(self) -> list[Request]:
        return self.scheduler.waiting

    @property
    def running(self) -> dict[str, Request]:
        return self.scheduler.running

    # ---- requests -------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        for name, sig in self.graph.stream_edges().items():
            assert sig.stream is not None
            req.streams[name] = StreamBuffer(sig.stream.policy, keep_past_end=sig.stream.past_end_signal is not None)
        self.scheduler.add(req)

    def push_stream(self, request_id: str, signal: str, value: torch.Tensor) -> None:
        """An item of a stream produced in another process."""
        req = self.scheduler.find(request_id)
        if req is not None:
            req.streams[signal].append(value)

    def close_stream(self, request_id: str, signal: str) -> None:
        req = self.scheduler.find(request_id)
        if req is not None:
            req.streams[signal].closed = True

    def abort(self, request_id: str) -> None:
        req = self.scheduler.find(request_id)
        if req is not None:
            req.aborted = True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.overlap.inflight)

    # ---- the loop -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        self._harvest(wait=False)
        self._reap_aborted()
        self._admit()
        groups = self.scheduler.ready_groups()
        busy = self.overlap.busy_node
        runnable = {k: v for k, v in groups.items() if k[0] != busy}  # type: ignore[index]
        # Nothing could run: only new input can change that.
        self.idle = not groups and self.overlap.inflight is None
        if runnable:
            keys = self.scheduler.pick_groups(runnable)
            self._run_groups([(k, runnable[k]) for k in keys[: 1 if busy else None]])
        elif busy is not None and not self._run_beside_worker(groups):
            self._harvest(wait=True)  # only the worker's node has work: wait for it
        self._finish_done_requests()
        out, self._outputs = self._outputs, []
        return out

    def _admit(self) -> None:
        while (admitted := self.scheduler.next_admission()) is not None:
            req, slot = admitted
            if slot is None:
                self._emit(RequestOutput(req.id, finished=True, finish_reason="abort"))
                continue
            try:
                self._start(req, slot)
            except Exception as exc:  # bad request: fails alone
                self.fail(req, exc)

    def _start(self, req: Request, slot: int) -> None:
        req.slots = {"__slot__": slot}
        for node in self.nodes.values():
            for state in node.slot_states.values():
                state[slot].zero_()  # the last holder's values are not this request's
        defaults = self.graph.input_defaults
        req.signals = {**{k: torch.as_tensor(v) for k, v in defaults.items() if k not in req.inputs}, **req.inputs}
        for node_name, node in self.nodes.items():
            if node.sampler is None:
                continue
            cfg = req.sampling.get(node_name)
            assert node.sampler_decl is not None
            prompt = None
            if node.sampler_decl.prompt_signal:
                # An optional input may hold the prompt: its default (GraphSpec.input_defaults)
                # when the request left it out; with neither, the penalties see no prompt ids.
                value = req.signals.get(node.sampler_decl.prompt_signal)
                prompt = value.reshape(-1).tolist() if value is not None else None
            node.sampler.add_request(slot, cfg, prompt or (), list(node.sampler_decl.stop_token_ids))
            req.slots[node_name] = slot
            if node.stop_rule is not None:
                node.stop_rule.add(slot, cfg.main if cfg is not None else None)
        for partition in self.local_partitions:
            req.cursors[partition] = WalkCursor(
                self.graph, partition, req.kwargs, lambda s, r=req: r.streams[s].drained
            )
        self._cursor_ended[req.id] = req  # a request may have no step to run here
        self._close_finished_streams(req)

    # ---- running a group ------------------------------------------------------------
    def _run_groups(self, picked: list[tuple[Hashable, list]]) -> None:
        """Run the picked groups. With two (``overlap_nodes``, always on two nodes) one goes
        to the worker thread and runs on across steps while this thread runs the other, so
        e.g. a codec call overlaps several LM steps; a stateless node's batch (a codec's or
        an encoder's, longer than an LM step) is the one handed over. Rows are built and
        completed on this thread."""
        plans = []
        readies = []  # each plan's ready rows
        first = False
        for key, ready in picked:
            node, group_walk, rows = self.scheduler.build_batch(key, ready)
            if rows:
                plans.append((node, group_walk, rows))
                readies.append(ready)
                self._count_forward(node, group_walk, rows)
        if len(plans) == 2:
            if plans[0][0].kind is EngineKind.STATELESS and plans[1][0].kind is not EngineKind.STATELESS:
                plans.reverse()
            self.overlap.submit(_execute, *plans[1])
            # A stream's first chunk is a request's first output (its time to first audio):
            # this step waits for it, as the worker then runs alone once this thread is done.
            first = any(r.req.streams[s].consumed == 0 for r in plans[1][2] for s in r.prepared.stream_ends)
            plans = plans[:1]
        elif len(plans) == 1 and self._split_over_threads(plans[0], readies[0]):
            return
        for node, walk, rows in plans:
            self._complete_rows(node, rows, _execute(node, walk, rows))
        if first:
            self._run_beside_worker(self.scheduler.ready_groups())
            self._harvest(wait=True)

    def _split_over_threads(self, plan: tuple[LoadedNode, str, list[Row]], ready: list) -> bool:
        """One group only, of a node with ``concurrent_forwards`` and more ready rows than
        one batch (e.g. the codec's last round, once the LM is done): the worker (idle, with
        ``overlap_nodes``) takes this batch and this thread runs the next beside it. Whether
        it did; the worker's batch is harvested by a later step."""
        node, walk, rows = plan
        if not (self.scheduler.config.overlap_nodes and node.submodule.concurrent_forwards and self.overlap.inflight is None):
            return False
        taken = {r.req.id for r in rows}
        if not any(r.req.id not in taken for r in ready):
            return False
        self.overlap.submit(_execute, node, walk, rows)
        self._run_beside_worker(self.scheduler.ready_groups())
        return True

    def _run_beside_worker(self, groups: dict[Hashable, list]) -> bool:
        """While the worker runs a batch of a node whose forwards may run concurrently
        (``NodeSubmodule.concurrent_forwards``) and this thread would otherwise wait, run the
        next batch of that node here, from requests the worker does not hold (e.g. the
        second codec call of a round: both cores decode). Whether a batch ran."""
        inflight = self.overlap.inflight
        if inflight is None or not inflight.node.submodule.concurrent_forwards:
            return False
        for key, ready in groups.items():
            if key[0] != inflight.node.name:  # type: ignore[index]
                continue
            free = [r for r in ready if not self.overlap.holds(r.req.id)]
            if not free:
                continue
            node, walk, rows = self.scheduler.build_batch(key, free)
            if rows:
                self._count_forward(node, walk, rows)
                self._complete_rows(node, rows, _execute(node, walk, rows))
                return True
        return False

    def _count_forward(self, node: LoadedNode, walk: str, rows: list[Row]) -> None:
        self.stats.steps += 1
        self.stats.forwards_by_group[f"{node.name}:{walk}"] += 1
        self.stats.last_batch_size = len(rows)

    def _harvest(self, wait: bool) -> None:
        """Complete the worker's batch once it has finished (``wait``: block until then)."""
        done = self.overlap.take(wait)
        if done is None:
            return
        self._complete_rows(done.node, done.rows, done.future.result())
        for req in done.deferred:
            self._free(req)

    def _complete_rows(self, node: LoadedNode, rows: list[Row], res: dict[str, object]) -> None:
        for row in rows:
            out = res.get(row.req.id)
            if row.req.status is not RequestStatus.RUNNING:
                continue  # failed or aborted meanwhile
            if isinstance(out, BaseException):
                self.fail(row.req, out, "internal")
            elif out is not None:
                self._complete_row(node, row, out)  # type: ignore[arg-type]

    # ---- after the forward ----------------------------------------------------------
    def _complete_row(self, node: LoadedNode, row: Row, outputs: dict[str, torch.Tensor]) -> None:
        req = row.req
        if node.kind is EngineKind.KV_CACHE:
            assert node.kv is not None
            if row.replay:
                history = req.kv_history[node.name]
                if node.kv.prefix_cache is not None:  # the recomputed blocks are shared again
                    fed = node.kv.num_tokens(req.id, "main") - row.num_tokens
                    node.kv.note_fed(req.id, "main", fed, history.identities(fed, row.num_tokens))
                if node.kv.num_tokens(req.id, "main") >= history.length:
                    req.needs_replay.discard(node.name)
                return
            start = row.prepared.done
            history = req.kv_history.get(node.name)
            if history is None:
                history = req.kv_history[node.name] = KVHistory()
            history.record(row.walk, row.prepared.info, row.prepared.inputs, start, start + row.num_tokens,  # type: ignore[arg-type]
                           row.prepared.cache_keys)
            if node.kv.prefix_cache is not None:
                keys = row.prepared.cache_keys
                fed = None if keys is None else keys[start : start + row.num_tokens]
                node.kv.note_fed(req.id, "main", row.prepared.info.num_computed_tokens, fed)
            row.prepared.done += row.num_tokens
            if not row.completes:
                return
        key = step_key(row.partition, row.step)
        del req.prepared[key]
        req.ready_since.pop(key, None)
        for stream, end in row.prepared.stream_ends.items():
            req.streams[stream].consume(end)
        try:
            node.submodule.postprocess(req.id, row.prepared.info, outputs)
        except Exception as exc:
            self.fail(req, exc, "internal")
            return
        check = row.stop or _GO_ON
        req.num_generated[node.name] = req.num_generated.get(node.name, 0) + 1
        self.stats.walks_completed.add(row.walk)
        routed = [name for name in row.step.outputs if name in outputs and name not in check.withheld]
        for name in routed:
            self._route(req, name, outputs[name])
        # Logits go with what the client gets of the step, not with a withheld stop (whose
        # outputs for other partitions, e.g. a fed-back token's embedding, still go on).
        if row.logits is not None and any(self._to_client(name) for name in routed):
            self._emit(RequestOutput(req.id, signal=LOGITS, data=row.logits))
        if check.reason and not req.finish_reason:
            req.finish_reason = check.reason
        cursor = req.cursors[row.partition]
        if check.stops:
            cursor.stop(check.stops)
        cursor.step_done(row.step)
        self.cursor_moved(req, row.partition)

    def _to_client(self, name: str) -> bool:
        sig = self.graph.signals.get(name)
        return sig is not None and sig.to_client

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

    def cursor_moved(self, req: Request, partition: str) -> None:
        cursor = req.cursors[partition]
        for walk in cursor.pop_finished_walks():
            for name in self._walk_signals[walk]:
                sig = self.graph.signals.get(name)
                if sig is not None and not sig.persist:
                    req.signals.pop(name, None)
        if cursor.done:
            self._cursor_ended[req.id] = req
            self._close_finished_streams(req)

    def stop_partition(self, req: Request, partition: str) -> None:
        cursor = req.cursors[partition]
        for key in [k for k in req.prepared if k[0] == partition]:
            del req.prepared[key]
        cursor.stop({STOP_ALL})
        if cursor.pending:
            cursor.step_done(cursor.pending[0])
        self.cursor_moved(req, partition)

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
        # Only requests a cursor of which ended since the last look can have finished.
        ended, self._cursor_ended = self._cursor_ended, {}
        for req in ended.values():
            if req.status is RequestStatus.RUNNING and all(c.done for c in req.cursors.values()):
                self._emit(RequestOutput(req.id, finished=True, finish_reason=req.finish_reason or "stop"))
                self._release(req)

    def _reap_aborted(self) -> None:
        for req in list(self.running.values()):
            if req.aborted:
                self._emit(RequestOutput(req.id, finished=True, finish_reason="abort"))
                self._release(req)

    def fail(self, req: Request, exc: BaseException, error_type: str | None = None) -> None:
        """End ``req`` with an error; ``error_type`` defaults to admission's classification."""
        req.error = f"{type(exc).__name__}: {exc}"
        log.info("request %s failed: %s", req.id, req.error)
        kind = error_type or classify_error(exc, "admission")
        self._emit(RequestOutput(req.id, finished=True, finish_reason="error", error=req.error, error_type=kind))
        if req.id in self.running:
            self._release(req)

    def _release(self, req: Request) -> None:
        req.status = RequestStatus.FINISHED
        if self.overlap.defer(req):
            # Its batch is on the worker: out of the scheduler now, resources freed after.
            self.scheduler.release(req, None)
            return
        self._free(req)

    def _free(self, req: Request) -> None:
        self.scheduler.release(req, req.slots.pop("__slot__", None))
        for node in self.nodes.values():
            if node.kv is not None:
                node.kv.free_request(req.id)
            if node.sampler is not None and node.name in req.slots:
                node.sampler.remove_request(req.slots[node.name])
                if node.stop_rule is not None:
                    node.stop_rule.remove(req.slots[node.name])
            node.submodule.cleanup_request(req.id)
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
