"""The submodule contract the engines drive (its reference: docs/reference.md).

Per step of a node the engine calls, for each row (request):
``prepare_inputs`` (its signals → ``NodeInputs``; for a long prompt ``split_inputs`` cuts
the chunk this step runs), then once for the batch ``preprocess`` (collate) and
``forward_batched`` (tensors in, ``BatchedModelOutput`` out), then per row ``postprocess``
and ``check_stop`` (or ``check_stop_batched`` once for the batch).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import torch
from torch import nn

from mstar.attention.backend import AttentionBackend
from mstar.plugins.deprecations import deprecated, warn_overridden
from mstar.sampling import BatchSampler, SamplingParams

# A piecewise region bound to the step's sampler: called with the region's static inputs.
RegionRunner = Callable[[dict[str, torch.Tensor]], dict[str, Any]]

STOP_ALL = "*"
"""A stop name ending the request's current partition: no further steps or walks there."""


@dataclass
class NodeInputs:
    """One row's inputs to one step. ``input_seq_len`` is the number of positions the row
    adds (KV nodes plan their cache from it)."""

    tensor_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_seq_len: int = 0
    graph_walk: str | None = None

    def clone(self) -> NodeInputs:
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = v.clone()
            elif isinstance(v, dict):
                v = {k: t.clone() if isinstance(t, torch.Tensor) else t for k, t in v.items()}
            values[f.name] = v
        return type(self)(**values)


@dataclass
class ARNodeInputs(NodeInputs):
    """Inputs of an autoregressive (KV) node: ``input_ids`` [n] or ``input_embeds`` [n, H]."""

    input_ids: torch.Tensor | None = None
    input_embeds: torch.Tensor | None = None
    custom_pos_ids: torch.Tensor | None = None

    def slice(self, start: int, end: int) -> ARNodeInputs:
        return replace(
            self,
            input_ids=None if self.input_ids is None else self.input_ids[start:end],
            input_embeds=None if self.input_embeds is None else self.input_embeds[start:end],
            custom_pos_ids=None if self.custom_pos_ids is None else self.custom_pos_ids[..., start:end],
            input_seq_len=end - start,
        )

    @staticmethod
    def concat(parts: list[ARNodeInputs]) -> ARNodeInputs:
        """The inputs of several steps as one (to recompute a preempted request's cache)."""

        def cat(name: str) -> torch.Tensor | None:
            ts = [getattr(p, name) for p in parts]
            if all(t is None for t in ts):
                return None
            if any(t is None for t in ts):
                raise ValueError(f"cannot concatenate inputs where only some rows have {name}")
            # Steps' inputs may sit on different devices (a prompt on the host, sampled
            # tokens on the accelerator): gather them where the first one is.
            return torch.cat([t.to(ts[0].device) for t in ts], dim=-1 if name == "custom_pos_ids" else 0)

        return ARNodeInputs(
            input_ids=cat("input_ids"),
            input_embeds=cat("input_embeds"),
            custom_pos_ids=cat("custom_pos_ids"),
            input_seq_len=sum(p.input_seq_len for p in parts),
            graph_walk=parts[-1].graph_walk,
        )


@dataclass
class CurrentForwardPassInfo:
    """What the engine tells a submodule about one row of this step."""

    request_id: str
    walk: str  # the row's own walk, even inside a merged (mixed) batch
    request_kwargs: Mapping[str, Any]
    num_computed_tokens: int = 0  # KV positions of this node before this step
    is_last_chunk: bool = True  # False for a non-final prefill chunk or a cache recompute
    iteration: int = 0  # how many times this step already ran in its loop
    num_generated: int = 0  # completed steps of this node that produced a sample
    sampling: SamplingParams | None = None  # the row's main sampling params, if it samples


@dataclass
class PerRequestState:
    """Engine-owned per-request state a submodule keeps across steps; freed with the request."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.kwargs.get(key, default)

    def add(self, key: str, value: Any) -> None:
        (self.tensors if isinstance(value, torch.Tensor) else self.kwargs)[key] = value


@dataclass(frozen=True)
class SlotState:
    """A per-request state of fixed shape kept for the whole batch in one tensor
    (``NodeSubmodule.slot_states``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


@dataclass
class ModelInputsFromEngine:
    """Everything the engine hands a batched forward besides the collated inputs."""

    request_ids: list[str]
    per_request_info: dict[str, CurrentForwardPassInfo]
    per_request_states: Mapping[str, PerRequestState] = field(default_factory=dict)
    attention: AttentionBackend | None = None  # planned for this step (KV nodes)
    positions: torch.Tensor | None = None  # [T] absolute positions of the new tokens
    qo_indptr: torch.Tensor | None = None  # [B+1] row offsets into the flat token dim
    sampler: BatchSampler | None = None  # the batch's gathered sampler
    piecewise_runners: dict[str, RegionRunner] = field(default_factory=dict)
    # Cross-attention nodes: [S, E] the encoder states of the rows that write their cross
    # caches this step (``cross_write_rows``, in batch order), concatenated; None when no row
    # does. Project them per layer and pass them to ``attention.cross``.
    cross_states: torch.Tensor | None = None
    cross_write_rows: tuple[int, ...] = ()
    # Nodes declaring ``slot_states``: each name's whole [max_num_seqs, *shape] tensor (the
    # same object every step), and [B] int64 each row's slot in it, on the node's device.
    slot_states: Mapping[str, torch.Tensor] = field(default_factory=dict)
    slot_index: torch.Tensor | None = None

    def run_region(
        self, label: str, fn: Callable[[dict[str, torch.Tensor], Any], dict[str, Any]], static_inputs: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Run the piecewise region ``label`` (``fn`` is its ``capture_fn``): through its
        runner when the engine built one, else ``fn`` directly with the batch's sampler."""
        runner = self.piecewise_runners.get(label)
        return runner(static_inputs) if runner is not None else fn(static_inputs, self.sampler)

    @property
    def last_token_index(self) -> torch.Tensor:
        """[B] index of each row's last new token in the flat token dim."""
        assert self.qo_indptr is not None
        return self.qo_indptr[1:] - 1


@dataclass
class BatchedModelOutput:
    """A step's outputs: ``row_outputs`` are batch-first tensors (row i → request i), the
    vectorised path; ``per_rid_outputs`` hold ragged per-request tensors."""

    row_outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    per_rid_outputs: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def select(self, rows: list[int]) -> BatchedModelOutput:
        """The outputs of a subset of rows, in the given order."""
        index = torch.tensor(rows, dtype=torch.long)
        return BatchedModelOutput(
            {k: v.index_select(0, index.to(v.device)) for k, v in self.row_outputs.items()},
            self.per_rid_outputs,
        )

    def by_request(self, request_ids: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        """Each row's outputs (row i is ``request_ids[i]``): its slice of every row output
        plus its per-request outputs. Each row output is split once (one ``unbind``), not
        indexed per row."""
        columns = {k: v.unbind(0) for k, v in self.row_outputs.items()}
        out = {}
        for i, rid in enumerate(request_ids):
            row = {k: col[i] for k, col in columns.items()}
            row.update(self.per_rid_outputs.get(rid, {}))
            out[rid] = row
        return out

    def for_row(self, i: int, request_id: str) -> dict[str, torch.Tensor]:
        """Deprecated since plugin API 1.1: ``by_request(request_ids)[request_id]``."""
        deprecated("BatchedModelOutput", "for_row").use(stacklevel=2)
        out = {k: v[i] for k, v in self.row_outputs.items()}
        out.update(self.per_rid_outputs.get(request_id, {}))
        return out


class StopCheck(NamedTuple):
    """``check_stop``'s answer: loops to stop (``STOP_ALL`` ends the partition), outputs
    of this step that must not be routed (e.g. an end-of-speech token), and why it stopped
    (reported to the client, e.g. "stop" or "length")."""

    stops: frozenset[str] = frozenset()
    withheld: tuple[str, ...] = ()
    reason: str | None = None


class BatchedStopCheck(NamedTuple):
    """Per request id, for the rows that stop or withhold; rows left out continue."""

    checks: dict[str, StopCheck]


class NodeSubmodule(nn.Module, ABC):
    """A model's compute unit for one node of its graph."""

    # Whether two forwards of this (stateless) node, on different requests, may run at once
    # on two threads: its forward keeps no state of its own between calls (per-request
    # state is fine). With ``overlap_nodes``, while the worker thread runs one batch of such
    # a node and nothing else is ready, the engine's thread runs the next batch beside it.
    concurrent_forwards: bool = False

    @abstractmethod
    def prepare_inputs(
        self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]
    ) -> NodeInputs:
        """One row's inputs from its routed signals. May raise ValueError for bad input:
        the request fails alone with that message."""

    def preprocess(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]
    ) -> dict[str, Any]:
        """Collate the rows into the keyword arguments of ``forward_batched``."""
        return {"inputs": inputs}

    @abstractmethod
    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, **kwargs: Any
    ) -> BatchedModelOutput:
        """Pure tensor computation over the batch."""

    def postprocess(
        self, request_id: str, info: CurrentForwardPassInfo, outputs: dict[str, torch.Tensor]
    ) -> None:
        """Per-row metadata work on outputs, in place (rename, drop). Default nothing."""

    def check_stop(
        self, request_id: str, info: CurrentForwardPassInfo, outputs: Mapping[str, torch.Tensor]
    ) -> set[str] | StopCheck:
        """One row's model-specific stop (may read tensor values): a convenience that the
        default ``check_stop_batched`` calls per row when a plugin overrides it. Default none."""
        return set()

    def check_stop_batched(
        self,
        request_ids: list[str],
        infos: list[CurrentForwardPassInfo],
        outputs: BatchedModelOutput,
    ) -> BatchedStopCheck | None:
        """The engine's one stop hook: model-specific stops of the rows whose step completed
        this forward (``outputs`` holds just those rows), added to core's stop rule
        (``mstar.engine.stop_rules``). Default: per-row ``check_stop`` where a plugin
        overrides it, else none (None: no row stops)."""
        if type(self).check_stop is NodeSubmodule.check_stop:
            return None
        per_row = outputs.by_request(request_ids)
        checks = {}
        for rid, info in zip(request_ids, infos, strict=True):
            check = self.check_stop(rid, info, per_row[rid])
            if not isinstance(check, StopCheck):
                check = StopCheck(frozenset(check))
            if check != StopCheck():
                checks[rid] = check
        return BatchedStopCheck(checks)

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        return True

    def output_cache_key(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: NodeInputs
    ) -> Hashable | None:
        """Stateless nodes, with the engine's output cache on (``EngineConfig.output_cache_bytes``,
        ``mstar serve --prefix-caching``): a key such that rows with equal keys have equal
        outputs (e.g. a digest of an encoder's input tensors' bytes and shapes); a row whose
        key is cached gets the cached outputs without a forward (and without
        ``check_stop_batched``). None (the default): always computed."""
        return None

    def max_batch_size(self, graph_walk: str) -> int | None:
        return None

    def compile_regions(self) -> int:
        """Set the parts of this node's forward that gain from ``torch.compile`` to run
        compiled (e.g. a small model run many times per step, where per-op overhead
        dominates); return how many. Called once at load when ``EngineConfig.compile_regions``
        is on; each region compiles on its first call of each new shape. Default: none."""
        return 0

    def get_autocast_dtype(self) -> torch.dtype | None:
        """Deprecated since plugin API 1.1 (core never called it): ``ModelSpec.float32_nodes``."""
        deprecated("NodeSubmodule", "get_autocast_dtype").use(stacklevel=2)
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        warn_overridden(cls, "NodeSubmodule")  # a plugin's node still defining a retired method

    def cleanup_request(self, request_id: str) -> None:
        """Drop private per-request state; the engine calls it when a request leaves."""

    def slot_states(self) -> Mapping[str, SlotState]:
        """Per-request states of fixed shape, held by the engine as one tensor per name,
        ``[max_num_seqs, *shape]``: a request owns row ``slot`` of each from admission to its
        end (through chunked prefill and preemption), zeroed when it is admitted.
        ``forward_batched`` gets them as ``engine_inputs.slot_states`` with the rows' slots in
        ``engine_inputs.slot_index``: gather with ``index_select``, write with ``index_copy_``
        — a batch-level view, where ``PerRequestState`` would be stacked row by row each step."""
        return {}


@dataclass(frozen=True)
class KVCacheLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype | None = None  # None: the node's dtype (core's choice, --dtype)
    # Encoder–decoder nodes: the persisted signal holding a request's encoder states [S, E].
    # Each request then also holds S cross-attention positions in this cache (same layers,
    # heads and head_dim), written from the states at its first forward here and read by
    # ``engine_inputs.attention.cross`` on every step (``mstar.attention.cross``).
    cross_attention: str | None = None


class ARNodeSubmodule(NodeSubmodule):
    """A node on the paged KV cache. Its layers call ``engine_inputs.attention.run(layer,
    q, k, v)``, planned by the engine for the step."""

    @abstractmethod
    def kv_cache_layout(self) -> KVCacheLayout: ...

    @abstractmethod
    def max_model_len(self) -> int: ...

    def attention_mask(
        self, graph_walk: str, info: CurrentForwardPassInfo, query_len: int, kv_len: int
    ) -> torch.Tensor | None:
        """This row's attention rule for the step: None (the default) is causal; else a
        bool [query_len, kv_len] mask, True = may attend, over the row's whole cache (the
        new tokens are its last ``query_len`` positions). E.g. frame-causal attention of a
        world model that adds a frame of many tokens per step."""
        return None

    def prefix_cache_keys(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs
    ) -> Sequence[Hashable] | None:
        """Prefix caching (``EngineConfig.prefix_caching``): one identity per position of this
        step's inputs, such that the same identities at the same positions after the same
        prefix give the same K/V; None: these positions (and all after them) are never
        shared. Default: the token ids when the inputs are plain ids (no embeddings, custom
        positions, tensor inputs or kwargs), else None. Override to name what else a
        position's K/V depends on (e.g. a media item's content hash for its embedding
        rows, a speaker embedding's hash), or return None to opt the node out."""
        if (
            inputs.input_ids is None
            or inputs.input_embeds is not None
            or inputs.custom_pos_ids is not None
            or inputs.tensor_inputs
            or inputs.kwargs
        ):
            return None
        ids = inputs.input_ids  # a decode step's one id: no reshape, which costs more than tolist
        return (ids if ids.dim() == 1 else ids.reshape(-1)).tolist()

    def chunk_unit(self) -> int:
        """Chunked prefill and cache recompute end every chunk on a multiple of this many
        cache positions (e.g. the tokens of one video frame). Default 1: anywhere."""
        return 1

    def split_inputs(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs, start: int, end: int
    ) -> ARNodeInputs:
        """This step's inputs restricted to positions [start, end) (chunked prefill)."""
        if inputs.tensor_inputs:
            raise NotImplementedError(
                f"{type(self).__name__} has tensor_inputs and must override split_inputs to be chunked"
            )
        return inputs.slice(start, end)
