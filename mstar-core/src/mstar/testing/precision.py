"""Checking a model served in half precision against float32 (``--dtype``).

A tiny random checkpoint's logits are nearly flat, so half precision flips its greedy
tokens within a few steps whatever the implementation; what can be held to a tolerance is
the first draw of each sampling node, which both runs compute from the same inputs. Plugins'
tests use ``first_draw_logits`` on an engine per dtype and compare with ``relative_error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def first_draw_logits(engine: Any, requests: Sequence[Mapping[str, Any]]) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Run ``requests`` (``Engine.run_batch`` items); return, for every node with a sampler,
    the float32 logits of its first main draw (one row per request of that step), and the
    results. Raises if a request fails."""
    seen: dict[str, torch.Tensor] = {}
    patched = []
    for name, node in engine.core.nodes.items():
        sampler = getattr(node, "sampler", None)
        if sampler is None:
            continue
        original = sampler.sample

        def spy(logits: torch.Tensor, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            seen.setdefault(_name, logits.detach().float().clone())
            return _original(logits, *args, **kw)

        sampler.sample = spy
        patched.append(sampler)
    try:
        results = engine.run_batch(list(requests))
    finally:
        for sampler in patched:
            del sampler.sample  # the class's method again
    failed = [r.error for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"request(s) failed: {failed}")
    return seen, results


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` over the finite entries of ``expected``
    (masked logits are -inf in both)."""
    actual, expected = actual.float(), expected.float()
    finite = torch.isfinite(expected)
    if not torch.equal(finite, torch.isfinite(actual)):
        return float("inf")
    diff = (actual[finite] - expected[finite]).norm()
    return float(diff / expected[finite].norm().clamp_min(1e-30))


def parameter_dtypes(engine: Any) -> dict[str, set[torch.dtype]]:
    """``{node: dtypes of its floating parameters}``."""
    return {name: {p.dtype for p in node.submodule.parameters() if p.is_floating_point()}
            for name, node in engine.core.nodes.items()}
