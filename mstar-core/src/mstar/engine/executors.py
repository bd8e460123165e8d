"""Running one batch of rows through one node: the KV-cache and the stateless executor."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mstar.attention import AttentionBatch, AttentionRow
from mstar.attention.cross import CrossAttentionBatch
from mstar.engine.output_cache import OutputCache
from mstar.engine.stop_rules import StopRule, merge
from mstar.graph import EngineKind, Step
from mstar.model.spec import NodeSamplers
from mstar.model.submodule_base import (
    ARNodeSubmodule,
    BatchedModelOutput,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
    StopCheck,
)
from mstar.parallel.group import GroupFailure

if TYPE_CHECKING:
    from mstar.engine.piecewise import PiecewiseRunner
    from mstar.engine.request import PreparedStep, Request
    from mstar.kv import KVCacheManager

RowResult = dict[str, torch.Tensor] | BaseException

# Request kwarg: return, per drawn token, the [vocab] main logits it was drawn from (float32,
# before temperature and penalties) as signal LOGITS. A framework feature for parity tests.
RETURN_LOGITS, LOGITS = "return_logits", "logits"


@dataclass
class Row:
    req: Request
    partition: str
    step: Step
    walk: str
    prepared: PreparedStep
    inputs: NodeInputs  # what this forward runs (a chunk of the step, or a cache replay)
    num_tokens: int
    replay: bool
    completes: bool
    cache_len: int = 0  # KV nodes: the row's cache positions once this forward has run
    stop: StopCheck | None = None  # the step's stop (core's rule merged with the plugin's)
    logits: torch.Tensor | None = None  # [V] main logits, for a request with return_logits
    cross_write: bool = False  # cross-attention nodes: this forward writes the row's cross cache


class NodeExecutionError(Exception):
    def __init__(self, partial: dict[str, RowResult]) -> None:
        super().__init__("node execution failed")
        self.partial = partial


@dataclass
class LoadedNode:
    name: str
    kind: EngineKind
    submodule: NodeSubmodule
    device: torch.device
    kv: KVCacheManager | None = None
    attention: Any = None
    sampler: Any = None  # MultiSampler
    sampler_decl: NodeSamplers | None = None
    stop_rule: StopRule | None = None  # sampling nodes: core's stop rule over their slots
    output_cache: OutputCache | None = None  # stateless nodes that key their rows' outputs
    piecewise: dict[str, PiecewiseRunner] = field(default_factory=dict)
    cross_signal: str | None = None  # KV nodes with cross-attention: KVCacheLayout.cross_attention
    slot_states: dict[str, torch.Tensor] = field(default_factory=dict)  # NodeSubmodule.slot_states, allocated
    executor: NodeExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.executor = KVNodeExecutor(self) if self.kind is EngineKind.KV_CACHE else StatelessNodeExecutor(self)

    @functools.cached_property
    def chunk_unit(self) -> int:
        """The KV node's chunk unit (``ARNodeSubmodule.chunk_unit``), asked once."""
        assert isinstance(self.submodule, ARNodeSubmodule)
        return self.submodule.chunk_unit()

    @functools.cached_property
    def max_model_len(self) -> int:
        """The KV node's limit, asked once: the scheduler reads it for every row of every step."""
        assert isinstance(self.submodule, ARNodeSubmodule)
        return self.submodule.max_model_len()


class NodeExecutor:
    def __init__(self, node: LoadedNode) -> None:
        self.node = node
        # The last batch's sampler slots and the tensor made of them: a batch of the same rows
        # in the same order (a run of decode steps) reuses the tensor, so the sampler finds
        # the rows' parameters it gathered for it (SlotSampler.stage keys them by the object).
        self._slots: tuple[tuple[int, ...], torch.Tensor] | None = None

    def slot_tensor(self, rows: list[Row]) -> torch.Tensor:
        """int64 [B]: each row's slot (its sampler's and slot states' row), on the node's device."""
        key = tuple(r.req.slots["__slot__"] for r in rows)
        if self._slots is None or self._slots[0] != key:
            self._slots = key, torch.tensor(key, dtype=torch.long, device=self.node.device)
        return self._slots[1]

    def run(self, walk: str, rows: list[Row]) -> dict[str, RowResult]:
        """Outputs per request id; a batch whose forward raises is retried row by row so a
        failing request fails alone."""
        snap = self._sampler_snapshot(rows)
        try:
            return self._run_checked(walk, rows)
        except GroupFailure:  # the engine's tensor-parallel group broke: no row can run
            raise
        except Exception as exc:
            if len(rows) == 1:
                return {rows[0].req.id: exc}
        if snap is not None:  # rows that already drew must draw the same step again
            self.node.sampler.restore(*snap)
        results: dict[str, RowResult] = {}
        for row in rows:
            try:
                results.update(self._run_checked(walk, [row]))
            except GroupFailure:
                raise
            except Exception as exc:
                results[row.req.id] = exc
        return results

    def _sampler_snapshot(self, rows: list[Row]) -> tuple[torch.Tensor, Any] | None:
        if self.node.sampler is None:
            return None
        slots = self.slot_tensor(rows)
        return slots, self.node.sampler.snapshot(slots)

    def _run_checked(self, walk: str, rows: list[Row]) -> dict[str, RowResult]:
        sub = self.node.submodule
        engine_inputs = self._engine_inputs(rows)
        with torch.inference_mode():
            kwargs = sub.preprocess(walk, engine_inputs, [r.inputs for r in rows])
            out = BatchedModelOutput()
            forward_out = sub.forward_batched(walk, engine_inputs, **kwargs)
            out = forward_out if isinstance(forward_out, BatchedModelOutput) else BatchedModelOutput(per_rid_outputs=forward_out)
        done = [i for i, r in enumerate(rows) if r.completes]
        if done:
            self._stops([rows[i] for i in done], done, len(rows), out, engine_inputs.sampler)
        return out.by_request([r.req.id for r in rows])

    def _stops(self, done: list[Row], positions: list[int], total: int, out: BatchedModelOutput, sampler: Any) -> None:
        """Each completed row's stop: core's rule on the drawn tokens (sampling nodes) and the
        plugin's ``check_stop_batched``, once for the batch. Also the kept logits of rows
        that asked for them."""
        view = out if len(done) == total else out.select(positions)
        plugin = self.node.submodule.check_stop_batched([r.req.id for r in done], [r.prepared.info for r in done], view)
        checks = plugin.checks if plugin is not None else {}
        core: list[StopCheck | None] = [None] * len(done)
        rule = self.node.stop_rule
        if sampler is not None and rule is not None and sampler.last_main_tokens is not None:
            drawn = sampler.last_main_tokens
            if len(done) != total:
                drawn = drawn.index_select(0, torch.tensor(positions, device=drawn.device))
            core = rule.apply(
                [r.req.slots[self.node.name] for r in done],
                drawn.tolist(),
                [r.cache_len for r in done],
                [r.step.outputs for r in done],
            )
            kept = sampler.last_main_logits
            if kept is not None:
                for r, i in zip(done, positions, strict=True):
                    if r.req.kwargs.get(RETURN_LOGITS):
                        r.logits = kept[i].float()
        for r, c in zip(done, core, strict=True):
            r.stop = merge(c, checks.get(r.req.id))

    def _engine_inputs(self, rows: list[Row]) -> ModelInputsFromEngine:
        ei = ModelInputsFromEngine(
            request_ids=[r.req.id for r in rows],
            per_request_info={r.req.id: r.prepared.info for r in rows},
            per_request_states={r.req.id: r.req.state(self.node.name) for r in rows},
        )
        if self.node.slot_states:
            ei.slot_states, ei.slot_index = self.node.slot_states, self.slot_tensor(rows)
        return ei


class StatelessNodeExecutor(NodeExecutor):
    def run(self, walk: str, rows: list[Row]) -> dict[str, RowResult]:
        cache = self.node.output_cache
        if cache is None:
            return self._run(walk, rows)
        results: dict[str, RowResult] = {}
        missed: list[Row] = []
        for row in rows:
            key = row.prepared.output_key
            hit = cache.get(key) if key is not None else None
            if hit is None:
                missed.append(row)
            else:
                results[row.req.id] = hit
        if missed:
            computed = self._run(walk, missed)
            for row in missed:
                out = computed.get(row.req.id)
                if row.prepared.output_key is not None and isinstance(out, dict):
                    cache.put(row.prepared.output_key, out)
            results.update(computed)
        return results

    def _run(self, walk: str, rows: list[Row]) -> dict[str, RowResult]:
        if len(rows) > 1 and not self.node.submodule.can_batch(walk, [r.prepared.info for r in rows]):
            results: dict[str, RowResult] = {}
            for row in rows:
                results.update(super().run(walk, [row]))
            return results
        return super().run(walk, rows)


class KVNodeExecutor(NodeExecutor):
    def __init__(self, node: LoadedNode) -> None:
        super().__init__(node)
        # The last step's attention metadata: a decode step over the same rows builds on it.
        self._attention_batch: AttentionBatch | None = None

    def _engine_inputs(self, rows: list[Row]) -> ModelInputsFromEngine:
        node = self.node
        ei = super()._engine_inputs(rows)
        sub = node.submodule
        assert isinstance(sub, ARNodeSubmodule)
        if type(sub).attention_mask is ARNodeSubmodule.attention_mask:  # causal everywhere
            masks: list[torch.Tensor | None] = [None] * len(rows)
        else:
            masks = [
                sub.attention_mask(r.walk, r.prepared.info, r.num_tokens, node.kv.num_tokens(r.req.id, "main"))
                for r in rows
            ]
        batch = self._attention_batch = AttentionBatch.build(
            [AttentionRow(r.req.id, "main", r.num_tokens, True, m) for r, m in zip(rows, masks, strict=True)],
            node.kv, node.device, [r.cache_len for r in rows], previous=self._attention_batch,
        )
        node.attention.plan(batch)
        ei.attention = node.attention
        if node.cross_signal is not None:
            self._plan_cross(rows, ei)
        ei.positions = batch.positions
        ei.qo_indptr = batch.qo_indptr
        if node.sampler is not None:
            slots = self.slot_tensor(rows)
            # None: every row advances (a decode batch), so no mask is made or applied.
            advance = None if all(r.completes for r in rows) else torch.tensor(
                [r.completes for r in rows], dtype=torch.bool, device=node.device
            )
            ei.sampler = node.sampler.bind(slots, advance)
            ei.sampler.keep_logits = any(r.req.kwargs.get(RETURN_LOGITS) for r in rows)
        ei.piecewise_runners = {label: runner.bind(ei.sampler) for label, runner in node.piecewise.items()}
        return ei

    def _plan_cross(self, rows: list[Row], ei: ModelInputsFromEngine) -> None:
        node = self.node
        writes = tuple(i for i, r in enumerate(rows) if r.cross_write)
        batch = CrossAttentionBatch.build(
            [r.req.id for r in rows], [r.num_tokens for r in rows], node.kv, node.device, writes
        )
        node.attention.plan_cross(batch)
        ei.cross_write_rows = writes
        if writes:
            states = [cross_states(rows[i].req.signals, node.cross_signal) for i in writes]  # type: ignore[arg-type]
            ei.cross_states = torch.cat(states).to(node.device)


def cross_states(signals: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A request's encoder states [S, E] for a cross-attention node (a leading batch dim of 1
    is dropped); a clear error when the signal is missing or has no positions."""
    states = signals.get(name)
    if states is None:
        raise ValueError(f"cross-attention signal {name!r} is missing: the node's step needs it as an input")
    if states.dim() == 3 and states.shape[0] == 1:
        states = states[0]
    if states.dim() != 2 or states.shape[0] == 0:
        raise ValueError(f"cross-attention signal {name!r} must be [S, E] with S >= 1, got {list(states.shape)}")
    return states
