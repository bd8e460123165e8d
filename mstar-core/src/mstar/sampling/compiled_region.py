"""Regions that draw tokens, compiled whole by ``torch.compile``.

A region (``PiecewiseGraphConfig.capture_fn``: ``fn(static_inputs, sampler)``) such as a
TTS code predictor's depth loop interleaves small model steps with sampler draws. The
sampler is Python (per-row parameters, counter-based uniforms, host-side branches), which
``torch.compile`` cannot trace, so compiling the steps alone leaves a graph break at every
draw. ``compile_region`` compiles the whole region instead: inside it the sampler is a
stand-in whose ``sample`` and ``sample_aux`` are opaque custom ops (``mstar::draw_main``,
``mstar::draw_aux``; chained per label so that no compiler pass reorders or drops a draw,
see ``_OpSampler``), and each op calls the batch's real sampler, bound for the call on
this thread. The draws are therefore the eager sampler's own: the same tokens for the same
logits, the same step counters. The model arithmetic around them is inductor's, equal to
eager up to float rounding.

Inside a compiled region a draw returns ``Draw`` (its ``tokens`` only: no logprobs).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

_bound = threading.local()


class Draw(NamedTuple):
    """A draw inside a compiled region: the rows' tokens (int64 [B])."""

    tokens: Tensor


def _sampler() -> Any:
    sampler = getattr(_bound, "sampler", None)
    if sampler is None:
        raise RuntimeError("a compiled region drew a token with no sampler bound (call it through compile_region)")
    return sampler


@torch.library.custom_op("mstar::draw_main", mutates_args=())
def _draw_main(logits: Tensor, after: Tensor | None) -> Tensor:
    return _sampler().sample(logits).tokens


@torch.library.custom_op("mstar::draw_aux", mutates_args=())
def _draw_aux(logits: Tensor, label: str, after: Tensor | None) -> Tensor:
    return _sampler().sample_aux(label, logits).tokens


@_draw_main.register_fake
def _draw_main_fake(logits: Tensor, after: Tensor | None) -> Tensor:
    return logits.new_empty(logits.shape[:-1], dtype=torch.int64)


@_draw_aux.register_fake
def _draw_aux_fake(logits: Tensor, label: str, after: Tensor | None) -> Tensor:
    return logits.new_empty(logits.shape[:-1], dtype=torch.int64)


class _OpSampler:
    """What a compiled region sees as its sampler, one per traced call.

    A draw advances its label's step counters, so two draws of one label must run in the
    order the region makes them, even where no data orders them (two draws from one set
    of logits), and none may be dropped as unused. The compiler keeps neither promise for
    an opaque op by itself (inductor reordered such draws in a test, effect registration
    or not), so each draw takes the label's previous draw as an input (``after``) and the
    last draw of every label leaves the graph as an output (``chain_ends``). Draws of
    different labels are not ordered: their counters are independent."""

    def __init__(self) -> None:
        self._last: dict[str, Tensor] = {}

    def sample(self, logits: Tensor) -> Draw:
        tokens = torch.ops.mstar.draw_main(logits, self._last.get(""))
        self._last[""] = tokens
        return Draw(tokens)

    def sample_aux(self, label: str, logits: Tensor) -> Draw:
        tokens = torch.ops.mstar.draw_aux(logits, label, self._last.get(label))
        self._last[label] = tokens
        return Draw(tokens)

    def chain_ends(self) -> tuple[Tensor, ...]:
        return tuple(self._last.values())


def compile_region(
    fn: Callable[[dict[str, Tensor], Any], dict[str, Any]], *, cpp_wrapper: bool = False
) -> Callable[[dict[str, Tensor], Any], dict[str, Any]]:
    """``fn(static_inputs, sampler)`` compiled whole (``fullgraph``: a graph break is an
    error, not a silent fallback), called the same way. Shapes compile on first use, and a
    dimension that changes (e.g. the row count) is made dynamic, as ``torch.compile``
    does by default. ``cpp_wrapper``: inductor's C++ wrapper, which runs the region's
    kernels without the GIL (another Python thread, e.g. the engine's overlap worker,
    then runs meanwhile) and with less per-kernel overhead; the draws take the GIL back."""
    options = {"cpp_wrapper": True} if cpp_wrapper else {}

    def region(static_inputs: dict[str, Tensor]) -> tuple[dict[str, Any], tuple[Tensor, ...]]:
        stand_in = _OpSampler()
        return fn(static_inputs, stand_in), stand_in.chain_ends()

    # Dynamo keeps its compiled graphs per code object, up to a recompile limit (8); one
    # code object per region keeps regions (and engines in one process) from sharing it.
    region = types.FunctionType(region.__code__.replace(), region.__globals__, region.__name__, None, region.__closure__)
    compiled = torch.compile(region, fullgraph=True, options=options)

    def run(static_inputs: dict[str, Tensor], sampler: Any) -> dict[str, Any]:
        before = getattr(_bound, "sampler", None)
        _bound.sampler = sampler
        try:
            return compiled(static_inputs)[0]
        finally:
            _bound.sampler = before

    return run
