"""The one line ``mstar serve`` prints when it is ready to take requests."""

from __future__ import annotations

from typing import Any


def kv_capacity_tokens(runtime: Any) -> dict[str, int]:
    """Tokens each KV-cache node can hold (blocks x block size), from the engines' reports."""
    return {node: tokens for node, (tokens, _) in _kv_capacity(runtime).items()}


def _kv_capacity(runtime: Any) -> dict[str, tuple[int, str]]:
    """Per KV node: (tokens it can hold, what the line adds about them)."""
    from mstar.engine.builder import EngineConfig

    block_size = int(runtime.config.engine_options.get("block_size", EngineConfig.block_size))
    out: dict[str, tuple[int, str]] = {}
    for engine in runtime.engines.values():
        for kv in engine.stats.kv if engine.stats is not None else ():
            note = ""
            if kv.cross_blocks >= 0:  # encoder–decoder: one pool for both caches
                note = f" (self- and cross-attention, {kv.block_bytes // block_size:,} bytes a token)"
            out[kv.node] = (kv.total_blocks * block_size, note)
    return out


def ready_summary(runtime: Any, url: str) -> str:
    """``model ... | placement ... | KV capacity ... | URL`` in one line."""
    installed = runtime.loaded.installed
    names = sorted(runtime.served_names() - {runtime.model_name})
    model = f"{runtime.model_name}" + (f" (also {', '.join(names)})" if names else "")
    groups = "; ".join(
        f"{g.name}: {', '.join(g.nodes)} on {', '.join(g.replica_devices())}" + (f" ({g.replicas} replicas)" if g.replicas > 1 else "")
        for g in runtime.placement.groups
    )
    kv = ", ".join(f"{node} {tokens:,} tokens{note}" for node, (tokens, note) in _kv_capacity(runtime).items()) or "none"
    from mstar.engine.builder import EngineConfig

    if kv != "none":
        on = runtime.config.engine_options.get("prefix_caching", EngineConfig.prefix_caching)
        kv += f" (prefix caching {'on' if on else 'off'})"
    return (
        f"mstar serve ready: model {model} [{installed.distribution} {installed.version}] from {runtime.checkpoint_dir} | "
        f"placement {groups} | KV capacity {kv} | {url}"
    )


def models_ready_summary(runtimes: list[Any], url: str) -> str:
    """``ready_summary`` for one model; for several, a line listing them all, then one
    line per model."""
    if len(runtimes) == 1:
        return ready_summary(runtimes[0], url)
    head = f"mstar serve ready: {len(runtimes)} models {', '.join(rt.model_name for rt in runtimes)} | {url}"
    return "\n".join([head, *(f"  {ready_summary(rt, url).removeprefix('mstar serve ready: ').rsplit(' | ', 1)[0]}" for rt in runtimes)])
