"""Checking a model's ``MixedBatchConfig``s against its graph when an engine is built.

The scheduler looks configs up by (node, walk): one naming a node or walk the graph does not
have, or a walk that never steps the node, would merge nothing and fail silently. These are
load-time errors instead, before any weights load.
"""

from __future__ import annotations

from collections.abc import Sequence

from mstar.graph import GraphSpec
from mstar.graph.spec import iter_steps
from mstar.model.spec import MixedBatchConfig


def validate_mixed_batches(configs: Sequence[MixedBatchConfig], graph: GraphSpec) -> list[MixedBatchConfig]:
    """``configs`` as a list when every one is sound; else a ``ValueError`` naming the
    config and what is wrong."""
    if not isinstance(configs, Sequence) or isinstance(configs, str):
        raise ValueError(f"mstar_mixed_batch_configs must return a list of MixedBatchConfig, got {type(configs).__name__}")
    seen: dict[tuple[str, str], str] = {}
    for mb in configs:
        if not isinstance(mb, MixedBatchConfig):
            raise ValueError(f"mstar_mixed_batch_configs returned {mb!r}, not a MixedBatchConfig")
        what = f"MixedBatchConfig {mb.merged_walk!r} of node {mb.node!r}"
        if mb.node not in graph.nodes:
            raise ValueError(f"{what}: the graph has no node {mb.node!r} (nodes: {sorted(graph.nodes)})")
        if len(set(mb.walks)) < 2:
            raise ValueError(f"{what}: merges {list(mb.walks)}; it needs at least two different walks")
        for walk in mb.walks:
            if walk not in graph.walks:
                raise ValueError(f"{what}: the graph has no walk {walk!r} (walks: {sorted(graph.walks)})")
            if all(step.node != mb.node for step in iter_steps(graph.walks[walk].body)):
                raise ValueError(f"{what}: walk {walk!r} never runs node {mb.node!r}")
            if (mb.node, walk) in seen:
                raise ValueError(f"{what}: walk {walk!r} of node {mb.node!r} is already merged by {seen[mb.node, walk]!r}")
            seen[mb.node, walk] = mb.merged_walk
        bad_caps = {w: n for w, n in mb.max_rows.items() if w not in mb.walks or isinstance(n, bool) or not isinstance(n, int) or n < 1}
        if bad_caps:
            raise ValueError(f"{what}: max_rows {bad_caps} must name its walks {list(mb.walks)} with integers >= 1")
    return list(configs)
