"""Linear layers on CPU through weights packed once for oneDNN.

``F.linear`` on CPU calls MKL's ``sgemm``, which repacks the weight on every call. For the
decode-sized calls a serving step makes (one to a few dozen rows against a weight that is
no longer in cache) that repacking, not the arithmetic, sets the time. oneDNN's inner-product
primitive on a weight reordered once into its blocked layout (``mkldnn::_reorder_linear_weight``
and ``mkldnn::_linear_pointwise``, the ops torch's own CPU compiler uses for frozen
weights) streams the weight instead. On the 2-core AMD EPYC host of ``benchmarks/``
(torch 2.13, two threads, 2026-12-02): the six layers of the Qwen3-TTS mid checkpoint's
talker took 2.7 ms against 4.9 ms for ``F.linear`` at 8 rows, eight Llama layers of width
512 9.6 against 16.4 ms at 8 rows and 168 against 226 ms at 512, a vocabulary head of
[156,940, 512] 14.9 ms against 56 ms at 8 rows and 29 against 87 ms at 32 (and against
75 ms for MKL's own packed GEMM, which this module used before).

What it costs: a packed copy of each weight it touches (about the weight's bytes), made on
the first packed call and kept while the weight lives (a weak cache keyed by the weight;
an in-place change of the weight repacks it).

What it changes numerically: float summation order against ``F.linear`` (relative
differences of ~1e-6). A row's outputs are bit-identical whatever the other rows of its
call hold and however many there are, at a fixed thread count
(``tests/core/layers/test_packed_linear.py`` checks 1-300 rows); plain ``F.linear`` does
not promise that.

Used only on CPU, for float32, where torch has oneDNN, and when autograd is off (the packed
op has no backward). ``pack_linears`` turns a module's ``nn.Linear`` layers into
``PackedLinear`` (same parameters, same state dict) and claims its linear and embedding
weights of at least ``MIN_PACK_ELEMENTS`` elements; ``linear`` and ``vocab_logits`` pack a claimed weight (a tied head's is the
embedding's) and leave any other to ``F.linear``. ``EngineConfig.cpu_packed_linears`` (on by
default) applies ``pack_linears`` to every node an engine loads on CPU.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

# id(weight) -> (a weak reference to it, its version when packed, the packed copy or None
# while claimed but not packed yet). Keyed by identity (tensors compare elementwise); the
# reference's callback drops the entry.
_packed: dict[int, tuple[weakref.ref, int, torch.Tensor | None]] = {}

# Smaller weights are left to F.linear: a oneDNN call costs ~12 us more than F.linear's, and
# a weight this small stays in cache, where F.linear's repacking is cheap (on the host of the
# figures above, a code predictor's [384, 128] layers ran 1.9x slower packed, a talker's
# [768, 256] ones 1.4x faster).
MIN_PACK_ELEMENTS = 1 << 16


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` can take the packed path at all."""
    return (
        x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and _AVAILABLE
    )


def _entry(weight: torch.Tensor) -> tuple[weakref.ref, int, torch.Tensor | None] | None:
    hit = _packed.get(id(weight))
    return hit if hit is not None and hit[0]() is weight else None


def _store(weight: torch.Tensor, version: int, packed: torch.Tensor | None) -> None:
    key = id(weight)
    _packed[key] = (weakref.ref(weight, lambda _, key=key: _packed.pop(key, None)), version, packed)


def claimed(weight: torch.Tensor) -> bool:
    """Whether ``pack_linears`` (or a packed call) has taken ``weight`` in."""
    return _entry(weight) is not None


def packed_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight``'s current packed copy, if one has been made."""
    hit = _entry(weight)
    return hit[2] if hit is not None and hit[1] == weight._version else None


def _pack(weight: torch.Tensor) -> torch.Tensor:
    packed = packed_copy(weight)
    if packed is None:
        with torch.inference_mode(False), torch.no_grad():
            # No batch-size hint: a hint of 1 picks a layout whose rows' bits depend on
            # the call's row count; the default does not.
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        _store(weight, weight._version, packed)
    return packed


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the packed weight (``usable(x, weight)`` must
    hold); any leading dims, any row count."""
    return torch.ops.mkldnn._linear_pointwise(x, _pack(weight), bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through the packed weight where ``weight`` is claimed and usable: for
    model code that computes a layer from its parameters instead of calling the module. A
    row-parallel weight (``mstar.parallel.shard``) sums the ranks' partial products, the
    bias added once after the sum."""
    group = getattr(weight, "mstar_row_parallel", None)
    if group is not None:
        out = group.all_reduce(_linear(x, weight, None))
        return out if bias is None else out + bias
    return _linear(x, weight, bias)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # Inside torch.compile the weight-keyed cache cannot be traced (not even its length,
    # so that test comes first); the compiler has its own choice of GEMM.
    if not torch.compiler.is_compiling() and _packed and claimed(weight) and usable(x, weight):
        return packed_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class PackedLinear(nn.Linear):
    """``nn.Linear`` whose calls on CPU use the packed weight (see the module docstring)
    where ``usable`` holds; every other call is ``F.linear``. Made by ``pack_linears``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and usable(x, self.weight):  # see linear
            return packed_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def pack_linears(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` under ``module`` whose weight is float32 on CPU into a
    ``PackedLinear`` in place (the object, its parameters and state-dict keys stay; only
    its class changes), and claim those weights and the float32 CPU ``nn.Embedding``
    weights for ``linear`` and ``vocab_logits`` (packed lazily, on a first call). Returns
    how many linears were changed; 0 where oneDNN's packed op is missing. Weights of fewer
    than ``MIN_PACK_ELEMENTS`` elements are left alone."""
    if not _AVAILABLE:
        return 0
    changed = 0
    for sub in module.modules():
        if type(sub) not in (nn.Linear, nn.Embedding):
            continue
        weight = sub.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.numel() < MIN_PACK_ELEMENTS:
            continue
        if not claimed(weight):
            _store(weight, -1, None)
        if type(sub) is nn.Linear:
            sub.__class__ = PackedLinear
            changed += 1
    return changed


_AVAILABLE = available()
