"""Regions that draw tokens, compiled whole by ``torch.compile``.

A region (``PiecewiseGraphConfig.capture_fn``: ``fn(static_inputs, sampler)``) such as a
TTS code predictor's depth loop interleaves small model steps with sampler draws. The
sampler is Python (per-row parameters, counter-based uniforms, host-side branches), which
``torch.compile`` cannot trace, so compiling the steps alone leaves a graph break at every
draw. ``compile_region`` compiles the whole region instead: inside it the sampler is a
stand-in whose ``sample`` and ``sample_aux`` are opaque custom ops (``mstar::draw_main``,
``mstar::draw_aux``; chained per label so that no compiler pass reorders or drops a draw,
see ``_OpSampler``), and each op calls the batch's real sampler, bound for the call on
this thread. Where ``mstar.native`` is built they are its C++ ops instead
(``mstar.sampling.native_draw``), which draw the common top-k batches themselves, with the
same ops, and call the sampler for the rest. The draws are therefore the eager sampler's own: the same tokens for the same
logits, the same step counters. The model arithmetic around them is inductor's, equal to
eager up to float rounding.

Inside a compiled region a draw returns ``Draw`` (its ``tokens`` only: no logprobs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from mstar.compile_bound import ThreadBinding, compile_bound
from mstar.native import native_module
from mstar.sampling import native_draw

_sampler = ThreadBinding("sampler")


class Draw(NamedTuple):
    """A draw inside a compiled region: the rows' tokens (int64 [B])."""

    tokens: Tensor


@torch.library.custom_op("mstar::draw_main", mutates_args=())
def _draw_main(logits: Tensor, after: Tensor | None) -> Tensor:
    return _sampler.get().sample(logits).tokens


@torch.library.custom_op("mstar::draw_aux", mutates_args=())
def _draw_aux(logits: Tensor, label: str, after: Tensor | None) -> Tensor:
    return _sampler.get().sample_aux(label, logits).tokens


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

    def __init__(self, native: bool) -> None:
        self._last: dict[str, Tensor] = {}
        self._native = native

    def sample(self, logits: Tensor) -> Draw:
        if self._native:
            tokens = torch.ops.mstar_native.draw_main(logits, self._last.get(""))
        else:
            tokens = torch.ops.mstar.draw_main(logits, self._last.get(""))
        self._last[""] = tokens
        return Draw(tokens)

    def sample_aux(self, label: str, logits: Tensor) -> Draw:
        if self._native:
            tokens = torch.ops.mstar_native.draw_aux(logits, native_draw.label_id(label), self._last.get(label))
        else:
            tokens = torch.ops.mstar.draw_aux(logits, label, self._last.get(label))
        self._last[label] = tokens
        return Draw(tokens)

    @property
    def draws_main(self) -> bool:
        return "" in self._last

    def chain_ends(self) -> tuple[Tensor, ...]:
        return tuple(self._last.values())


def compile_region(
    fn: Callable[[dict[str, Tensor], Any], dict[str, Any]], *, cpp_wrapper: bool = False
) -> Callable[[dict[str, Tensor], Any], dict[str, Any]]:
    """``fn(static_inputs, sampler)`` compiled whole (``mstar.compile_bound``), called the
    same way; the draws call ``sampler``, bound for the call."""

    native = native_module()
    # Whether the region draws from the main label (known once traced; until then, assume
    # so): the main draw's native state costs a gather of the rows' history to bind.
    draws_main = [True]

    def region(static_inputs: dict[str, Tensor]) -> tuple[dict[str, Any], tuple[Tensor, ...]]:
        stand_in = _OpSampler(native is not None)
        out = fn(static_inputs, stand_in), stand_in.chain_ends()
        draws_main[0] = stand_in.draws_main
        return out

    compiled = compile_bound(region, _sampler, cpp_wrapper=cpp_wrapper)

    def run(static_inputs: dict[str, Tensor], sampler: Any) -> dict[str, Any]:
        if native is None:
            return compiled(sampler, static_inputs)[0]
        native_draw.bind(native, sampler, main=draws_main[0])
        try:
            out = compiled(sampler, static_inputs)[0]
        except BaseException:
            native.unbind_draws()  # the engine undoes the step's sampler state
            raise
        native_draw.unbind(native, sampler)
        return out

    return run
