"""Building an ``EngineCore`` from a loaded model plugin and a checkpoint directory."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mstar.attention import create_backend
from mstar.blas_reproducibility import warn_if_thread_dependent
from mstar.engine.core import EngineCore, SchedulerConfig
from mstar.engine.executors import LoadedNode
from mstar.engine.mixed_batches import validate_mixed_batches
from mstar.engine.output_cache import OutputCache
from mstar.engine.piecewise import PiecewiseRunner
from mstar.engine.stop_rules import StopRule
from mstar.graph import EngineKind, GraphSpec
from mstar.kv import KVCacheManager
from mstar.layers.packed_linear import pack_linears
from mstar.model.precision import canonical_dtype, node_dtypes
from mstar.model.spec import ModelConfig, ModelSpec, NodeSamplers
from mstar.model.submodule_base import ARNodeSubmodule, NodeSubmodule
from mstar.parallel.group import init_tensor_parallel
from mstar.parallel.shard import local_kv_heads, shard_module
from mstar.sampling import MultiSampler
from mstar.weights.sharding import sharded_build

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    device: str = "cpu"
    kv_budget_bytes: int = 256 << 20  # shared by the KV nodes placed in this engine
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    chunked_prefill: bool = True
    mixed_batches: bool = True
    overlap_nodes: bool = False  # opt-in: a second node's batch runs beside the first (LM + codec)
    piecewise_graphs: bool = True
    cpu_packed_linears: bool = True  # on CPU: oneDNN-packed weights for linears and heads (layers.packed_linear)
    compile_regions: bool = False  # opt-in: nodes torch.compile the regions they offer (NodeSubmodule.compile_regions)
    # On CPU: torch threads of each engine-owned thread that runs forwards (the step loop, the
    # overlap worker); None: the builder's torch.get_num_threads(), halved with overlap_nodes.
    cpu_threads: int | None = None
    attention_backend: str | None = None  # "torch" / "flashinfer"; None picks by device
    # The nodes' dtype (mstar.model.precision): "auto" (the checkpoint's on accelerators, float32
    # on CPU), "bfloat16", "float16" or "float32"; ModelSpec.float32_nodes always float32.
    dtype: str = "auto"
    nodes: tuple[str, ...] | None = None  # nodes placed in this engine; None = all
    # KV nodes share cached prompt prefixes between requests (mstar.kv.prefix_cache); on by
    # default. A node opts out by returning None from ARNodeSubmodule.prefix_cache_keys.
    prefix_caching: bool = True
    # With prefix_caching: host memory for stateless nodes' cached outputs (e.g. a media
    # encoder's, for an image a conversation re-sends); mstar.engine.output_cache.
    output_cache_bytes: int = 256 << 20
    # Tensor parallelism (mstar.parallel): this engine is rank ``tensor_parallel_rank`` of
    # ``tensor_parallel_size`` processes meeting at ``tensor_parallel_init``; its KV nodes'
    # attention heads, MLP columns and LM head rows are split over them. Rank 0 takes the
    # requests (``Engine.follow`` on the others).
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    tensor_parallel_init: str = "tcp://127.0.0.1:29511"
    # With tensor_parallel_size > 1: MoE blocks that support it (shard_tensor_parallel reads
    # TensorParallelGroup.expert_parallel) keep whole experts, E / N on each rank, instead
    # of every expert's share of columns.
    expert_parallel: bool = False

    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            chunked_prefill=self.chunked_prefill,
            mixed_batches=self.mixed_batches,
            overlap_nodes=self.overlap_nodes,
        )


@dataclass
class BuiltModel:
    spec: ModelSpec
    config: ModelConfig
    graph: GraphSpec
    node_samplers: dict[str, NodeSamplers]
    core: EngineCore


def build_core(loaded: Any, checkpoint_dir: Path | None, engine_config: EngineConfig) -> BuiltModel:
    """``loaded`` is a ``mstar.plugins.loading.LoadedModel`` (spec + hook relay).

    Builds on a short-lived thread of its own, with the caller's torch thread count. Why:
    OpenMP (libgomp) keeps a pool of workers for every thread that ran a parallel region
    (loading and packing weights do) until that thread exits, and once two pools exist it
    stops their workers spinning between regions, so every parallel op of the engine's
    loop thread then waits for a woken worker (a [20, 512] x [512, 2048] packed matmul:
    0.28-0.35 against 0.15 ms with 2 threads on a 2-core host). Built here, the pool goes
    with the thread, and the loop thread's is the only one unless the caller's thread makes
    its own."""
    result: list[BuiltModel] = []
    failure: list[BaseException] = []
    threads = torch.get_num_threads()

    def build() -> None:
        torch.set_num_threads(threads)
        try:
            result.append(_build_core(loaded, checkpoint_dir, engine_config))
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    builder = threading.Thread(target=build, name="mstar-build")
    builder.start()
    builder.join()
    if failure:
        raise failure[0]
    return result[0]


def _build_core(loaded: Any, checkpoint_dir: Path | None, engine_config: EngineConfig) -> BuiltModel:

    spec: ModelSpec = loaded.spec
    hook = loaded.hook
    if checkpoint_dir is None:
        raise ValueError("a checkpoint directory is required (write a tiny one for random weights)")
    config = spec.load_config(checkpoint_dir)
    graph = spec.build_graph(config)
    graph.validate()
    mixed = validate_mixed_batches(hook.mstar_mixed_batch_configs(model_name=spec.name, config=config) or [], graph)
    factories = hook.mstar_node_factories(config=config)
    missing = set(graph.nodes) - set(factories)
    if missing:
        raise ValueError(f"model {spec.name!r} has no factory for node(s) {sorted(missing)}")
    node_samplers: dict[str, NodeSamplers] = hook.mstar_node_samplers(config=config) or {}
    device = torch.device(engine_config.device)
    if device.type == "cpu":
        warn_if_thread_dependent()
    tp = None
    if engine_config.tensor_parallel_size > 1:
        tp = init_tensor_parallel(engine_config.tensor_parallel_rank, engine_config.tensor_parallel_size,
                                  engine_config.tensor_parallel_init, device)
        tp.expert_parallel = engine_config.expert_parallel
    placed = engine_config.nodes or tuple(graph.nodes)
    kv_nodes = [n for n in placed if graph.nodes[n].kind is EngineKind.KV_CACHE]
    dtypes = node_dtypes(engine_config.dtype, config, device, placed, spec.float32_nodes)
    nodes: dict[str, LoadedNode] = {}
    for name in placed:
        is_kv = graph.nodes[name].kind is EngineKind.KV_CACHE
        # A tensor-parallel KV node is split while its factory builds it (materialize /
        # load_weights), so the rank reads and holds only its part of each split tensor.
        with sharded_build(functools.partial(shard_module, tp=tp)) if tp is not None and is_kv else contextlib.nullcontext():
            sub = build_node(name, factories[name], config, checkpoint_dir, device, dtypes[name], engine_config.dtype)
        sub.eval()
        if is_kv and not isinstance(sub, ARNodeSubmodule):
            raise TypeError(f"KV-cache node {name!r} must be an ARNodeSubmodule, got {type(sub).__name__}")
        layout = sub.kv_cache_layout() if is_kv else None  # the whole model's (from its config)
        split_heads = False
        if tp is not None and is_kv:  # encoders, codecs: whole on each rank
            counts = shard_module(sub, tp)  # what the factory's loading did not split yet, and counts
            log.info("node %s: rank %d of %d holds %s", name, tp.rank, tp.size, counts)
            # Attention it could not split (a plugin's own class without
            # shard_tensor_parallel) stays whole, and so does its cache.
            split_heads = counts["attention"] > 0
            if not split_heads:
                log.warning("node %s: no attention module was split over the %d ranks; every rank holds all heads",
                            name, tp.size)
        if device.type == "cpu" and engine_config.cpu_packed_linears:
            log.debug("node %s: %d linear layers packed for oneDNN", name, pack_linears(sub))
        if engine_config.compile_regions and (regions := sub.compile_regions()):
            log.info("node %s: %d region(s) set to compile with torch.compile", name, regions)
        node = LoadedNode(name, graph.nodes[name].kind, sub, device)
        if layout is not None:
            dtype = layout.dtype or dtypes[name]
            # With tensor parallelism the budget is each rank's (each device's): a rank holds
            # its key/value heads of every block, so the ranks hold the same blocks, and N
            # ranks hold N times the positions of one device when the heads split.
            heads = local_kv_heads(layout.num_kv_heads, tp.size) if split_heads else layout.num_kv_heads
            per_block = KVCacheManager.bytes_per_block(layout.num_layers, heads, layout.head_dim,
                                                       engine_config.block_size, dtype)
            if engine_config.kv_budget_bytes // len(kv_nodes) < per_block:
                raise ValueError(
                    f"KV cache budget of {engine_config.kv_budget_bytes // len(kv_nodes)} bytes for node {name!r} "
                    f"fits no block: one block of {engine_config.block_size} tokens costs {per_block} bytes"
                )
            node.kv = KVCacheManager(
                layout.num_layers,
                heads,
                layout.head_dim,
                engine_config.block_size,
                engine_config.kv_budget_bytes // len(kv_nodes) // per_block,
                dtype,
                device,
                engine_config.prefix_caching,
            )
            node.attention = create_backend(node.kv, engine_config.attention_backend)
            node.cross_signal = _cross_signal(name, layout.cross_attention, graph)
        elif (engine_config.prefix_caching and engine_config.output_cache_bytes > 0
              and type(sub).output_cache_key is not NodeSubmodule.output_cache_key):
            node.output_cache = OutputCache(engine_config.output_cache_bytes, device)
        decl = node_samplers.get(name)
        if decl is not None:
            defaults = {"main": decl.main, **decl.aux}
            vocab = {"main": decl.vocab_size, **{k: decl.aux_vocab_sizes.get(k, decl.vocab_size) for k in decl.aux}}
            node.sampler = MultiSampler(defaults, vocab, engine_config.max_num_seqs, device)
            node.sampler_decl = decl
            max_len = node.max_model_len if node.kind is EngineKind.KV_CACHE else None
            node.stop_rule = StopRule(decl, engine_config.max_num_seqs, max_len)
        if engine_config.piecewise_graphs:
            configs = hook.mstar_piecewise_graph_configs(model_name=spec.name, node=name, submodule=sub) or {}
            node.piecewise = {label: PiecewiseRunner(cfg) for label, cfg in configs.items()}
        nodes[name] = node
    threads = forward_threads(engine_config, device, len(nodes))
    core = EngineCore(graph, nodes, engine_config.scheduler(), mixed, forward_threads=threads)
    core.tensor_parallel = tp
    return BuiltModel(spec, config, graph, node_samplers, core)


def _cross_signal(node: str, signal: str | None, graph: Any) -> str | None:
    """A cross-attention node's encoder-states signal, checked: it must persist, since a
    request's cache is rewritten from it after preemption, long after the step that made it."""
    if signal is None:
        return None
    declared = graph.signals.get(signal)
    if declared is None or not declared.persist:
        raise ValueError(
            f"node {node!r}: its KV layout's cross_attention signal {signal!r} must be a graph "
            "signal with persist=True (its cache is rewritten from it after preemption)"
        )
    return signal


def build_node(name: str, factory: Any, config: ModelConfig, checkpoint_dir: Path, device: torch.device,
               dtype: torch.dtype, requested: str) -> Any:
    """Call the node's factory with its dtype. A factory written before factories took
    ``dtype`` builds in a dtype of its own choosing; when the user asked for one explicitly,
    its node is cast afterwards (costing a transient copy of the node)."""
    if accepts_keyword(factory, "dtype"):
        return factory(config, checkpoint_dir, str(device), dtype=dtype)
    sub = factory(config, checkpoint_dir, str(device))
    built = {p.dtype for p in sub.parameters() if p.is_floating_point()}
    if canonical_dtype(requested) != "auto" and built - {dtype}:
        log.warning("node %s: its factory takes no dtype argument; cast from %s to %s after building",
                    name, sorted(map(str, built)), dtype)
        sub = sub.to(dtype)
    return sub


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` (or the function a ``mstar.model.spec.lazy`` wrapper stands for)
    takes keyword ``name``."""
    import inspect

    target = fn.resolve() if callable(getattr(fn, "resolve", None)) else fn
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def forward_threads(config: EngineConfig, device: torch.device, num_nodes: int) -> int | None:
    """torch intra-op threads for each engine-owned thread that runs forwards on CPU (None
    off the CPU). With ``overlap_nodes`` two forwards run at once (an LM step beside a codec
    call), and two OpenMP teams of every core each spin over each other's cores: measured at
    1.4-1.5 s against 0.77 s for the Qwen3-TTS mid checkpoint at concurrency 8 on a 2-core
    host (docs/benchmarking.md), so by default each gets half. The count changes no bits:
    MKL runs in its strict mode (``mstar.blas_reproducibility``)."""
    if device.type != "cpu":
        return None
    if config.cpu_threads is not None:
        if config.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {config.cpu_threads}")
        return config.cpu_threads
    total = torch.get_num_threads()
    return max(1, total // 2) if config.overlap_nodes and num_nodes > 1 else total
