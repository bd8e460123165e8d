"""A request's sampling, resolved once: plugin defaults with the request's values on top,
labels checked, every seed set. The one place defaults are merged; the API process and
``mstar.Engine`` both call it, and the samplers take its result as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mstar.sampling.multi import MultiSamplingConfig


def per_node_sampling(decls: Mapping[str, Any], sampling: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``sampling`` keyed by sampling node as ``{"main": {...}, "aux": {...}}``.

    Accepted forms: ``{node: {"main": ..., "aux": ...}}``, ``{node: {main fields}}``, and
    for a model with one sampling node ``{"main": ..., "aux": ...}`` or its main fields.
    """
    sampling = dict(sampling or {})
    if len(decls) == 1 and sampling and not set(sampling) & set(decls):
        sampling = {next(iter(decls)): sampling}
    unknown = set(sampling) - set(decls)
    if unknown:
        raise ValueError(f"sampling given for node(s) {sorted(unknown)} that do not sample; sampling nodes: {sorted(decls)}")
    out: dict[str, dict[str, Any]] = {}
    for node, given in sampling.items():
        if isinstance(given, MultiSamplingConfig):
            given = given.model_dump(exclude_unset=True)
        if not isinstance(given, Mapping):
            raise ValueError(f"sampling for node {node!r} must be an object")
        out[node] = dict(given) if ("main" in given or "aux" in given) else {"main": dict(given)}
    return out


def resolve_node(decl: Any, given: Mapping[str, Any] | None) -> tuple[MultiSamplingConfig, int]:
    """One node's config (``decl`` is its ``NodeSamplers``) and the seed that reproduces it."""
    return MultiSamplingConfig.with_defaults(decl.main, decl.aux, given).resolve_seeds()


def resolve_sampling(
    decls: Mapping[str, Any], sampling: Mapping[str, Any] | None
) -> tuple[dict[str, MultiSamplingConfig], dict[str, int]]:
    """Every sampling node's resolved config, and its seed."""
    given = per_node_sampling(decls, sampling)
    configs: dict[str, MultiSamplingConfig] = {}
    seeds: dict[str, int] = {}
    for node, decl in decls.items():
        configs[node], seeds[node] = resolve_node(decl, given.get(node))
    return configs, seeds
