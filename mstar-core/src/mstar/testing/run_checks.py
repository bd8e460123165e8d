"""Conformance checks that run the plugin: build its nodes and push requests through the
real engine on the tiny checkpoint: every walk of the graph runs for the example requests,
a seeded request gives the same output again and beside an unseeded copy, the stop rules hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mstar.testing.check_context import CheckFailed, ConformanceContext

SEED = 1234


def check_piecewise_conventions(ctx: ConformanceContext) -> str:
    from mstar.engine.piecewise import check_calling_convention
    from mstar.model.spec import PiecewiseGraphConfig

    engine = _engine(ctx)
    count = 0
    for node_name, node in engine.core.nodes.items():
        configs = ctx.loaded.hook.mstar_piecewise_graph_configs(
            model_name=ctx.loaded.spec.name, node=node_name, submodule=node.submodule
        ) or {}
        for label, cfg in configs.items():
            if not isinstance(cfg, PiecewiseGraphConfig) or cfg.label != label:
                raise CheckFailed(f"node {node_name!r}: piecewise entry {label!r} is not a PiecewiseGraphConfig labelled {label!r}")
            try:
                check_calling_convention(cfg)
            except TypeError as exc:
                raise CheckFailed(f"node {node_name!r}: {exc}") from exc
            count += 1
    return f"{count} region(s)"


def check_every_walk_runs(ctx: ConformanceContext) -> str:
    engine = _engine(ctx)
    requests = _example_requests(ctx)
    results = engine.run_batch(requests)
    errors = [r.error for r in results if r.error]
    if errors:
        raise CheckFailed(f"example request failed: {errors[0]}")
    missing = sorted(set(ctx.graph.walks) - engine.core.stats.walks_completed)
    if missing:
        raise CheckFailed(f"walk(s) {missing} never ran for spec.example_requests; add requests that reach them")
    return f"{len(ctx.graph.walks)} walk(s) ran for {len(requests)} request(s)"


def check_seeds_reproduce(ctx: ConformanceContext) -> str:
    engine = _engine(ctx)
    nodes = sorted(engine.built.node_samplers)
    seeded = [_with_seed(r, SEED, nodes) for r in _example_requests(ctx)]
    first = [_signature(r) for r in engine.run_batch(seeded)]
    again = [_signature(r) for r in engine.run_batch(seeded)]
    # Same requests again, each next to an unseeded copy of itself.
    mixed = engine.run_batch([x for r in seeded for x in (r, {**r, "sampling": _drop_seed(r.get("sampling"))})])
    alongside = [_signature(r) for r in mixed[::2]]
    for label, run in (("a repeat", again), ("a run beside other requests", alongside)):
        if run != first:
            raise CheckFailed(f"a seeded example request gave different output on {label}")
    return f"{len(seeded)} request(s), seed {SEED}"


STOP_CHECK_MAX_TOKENS = 2


def check_stop_rules(ctx: ConformanceContext) -> str:
    """Each sampling node stops at ``max_tokens`` and on a stop id: core applies both rules
    to the main tokens a node draws through its batch sampler, so a node that picks tokens
    another way (and so runs past them) fails here."""
    engine = _engine(ctx)
    decls = engine.built.node_samplers
    if not decls:
        return "no sampling node"
    base = _example_requests(ctx)[0]
    nodes = sorted(decls)
    for node in nodes:
        capped = _with_main(base, nodes, node, max_tokens=STOP_CHECK_MAX_TOKENS, ignore_eos=True, min_tokens=0)
        steps, result = _steps_of(engine, node, capped)
        if steps > STOP_CHECK_MAX_TOKENS:
            raise CheckFailed(
                f"node {node!r} ran {steps} steps for max_tokens={STOP_CHECK_MAX_TOKENS}: draw the main "
                "token through engine_inputs.sampler so core's stop rules see it"
            )
        every_id = list(range(decls[node].vocab_size))
        stopping = _with_main(base, nodes, node, max_tokens=8, stop_token_ids=every_id, min_tokens=0)
        steps, result = _steps_of(engine, node, stopping)
        if steps != 1 or result.finish_reason != "stop":
            raise CheckFailed(
                f"node {node!r} ignored its stop ids: every id was a stop id, yet it ran {steps} steps "
                f"(finish_reason {result.finish_reason!r})"
            )
    return f"max_tokens and stop ids honoured by {nodes}"


def _with_main(request: dict[str, Any], nodes: list[str], node: str, **main: Any) -> dict[str, Any]:
    sampling = _per_node(request.get("sampling"), nodes)
    cfg = dict(sampling.get(node) or {})
    cfg = cfg if set(cfg) <= {"main", "aux"} else {"main": cfg}
    sampling[node] = {**cfg, "main": {**cfg.get("main", {}), **main}}
    return {**request, "sampling": sampling}


def _steps_of(engine: Any, node: str, request: dict[str, Any]) -> tuple[int, Any]:
    """Forwards of ``node`` for one request run alone: one per step on the tiny checkpoint."""

    def forwards() -> int:
        return sum(n for key, n in engine.core.stats.forwards_by_group.items() if key.split(":")[0] == node)

    before = forwards()
    result = engine.run_batch([request])[0]
    if result.error:
        raise CheckFailed(f"example request failed: {result.error}")
    return forwards() - before, result


def _engine(ctx: ConformanceContext) -> Any:
    def build() -> Any:
        from mstar.engine.builder import EngineConfig, build_core
        from mstar.engine.engine import Engine

        built = build_core(ctx.loaded, ctx.checkpoint_dir, EngineConfig(kv_budget_bytes=64 << 20))
        return Engine(built, ctx.loaded, ctx.checkpoint_dir)

    return ctx.once("engine", build)


def _example_requests(ctx: ConformanceContext) -> list[dict[str, Any]]:
    make: Callable[[dict], list[dict]] | None = ctx.loaded.spec.example_requests
    if make is None:
        raise CheckFailed("ModelSpec.example_requests is not set: the kit cannot run the model's walks")
    return make(ctx.config)


def _per_node(sampling: dict[str, Any] | None, nodes: list[str]) -> dict[str, Any]:
    """Sampling keyed by node (requests may use the single-node shorthand)."""
    sampling = dict(sampling or {})
    if len(nodes) == 1 and sampling and set(sampling) <= {"main", "aux"}:
        return {nodes[0]: sampling}
    if len(nodes) == 1 and sampling and not set(sampling) & set(nodes):
        return {nodes[0]: {"main": sampling}}
    return {n: sampling.get(n, {}) for n in nodes}


def _with_seed(request: dict[str, Any], seed: int, nodes: list[str]) -> dict[str, Any]:
    sampling = _per_node(request.get("sampling"), nodes)
    for node, cfg in list(sampling.items()):
        cfg = dict(cfg) if set(cfg) <= {"main", "aux"} else {"main": dict(cfg)}
        main = dict(cfg.get("main", {}))
        # Sampled, not greedy: the seed must matter.
        main.update(seed=seed, temperature=max(main.get("temperature", 1.0), 0.8))
        sampling[node] = {**cfg, "main": main}
    return {**request, "sampling": sampling}


def _drop_seed(sampling: dict[str, Any] | None) -> dict[str, Any]:
    return {node: {**cfg, "main": {k: v for k, v in cfg.get("main", {}).items() if k != "seed"}} for node, cfg in (sampling or {}).items()}


def _signature(result: Any) -> tuple:
    if result.error:
        raise CheckFailed(f"example request failed: {result.error}")
    return tuple((name, tuple(torch.cat([t.reshape(-1) for t in values]).tolist())) for name, values in sorted(result.signals.items()))
