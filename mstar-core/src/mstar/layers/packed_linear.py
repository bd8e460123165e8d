"""Linear layers on CPU with weights packed once for MKL, for decode-sized batches.

For ``x @ W.T`` with 16-32 rows, MKL's ``sgemm`` takes a slow path on this kind of CPU:
it repacks ``W`` on every call. On the 2-core host used for ``benchmarks/`` (torch 2.13,
MKL 2024.2, two threads), a [2048, 512] layer took 0.67-0.83 ms per call at 16-32 rows and
0.37 ms at 12. MKL's packed GEMM (``cblas_sgemm_pack``, reached as
``torch.ops.mkl._mkl_linear``) packs ``W`` once for a fixed row count; called with 32 rows
it took 0.38-0.42 ms, so we pad 16-32 rows to 32 (the pad rows are zeros, their outputs are
dropped). For a vocabulary-sized head ([156,940, 512]) it beats the transposed GEMM of
``vocab_head`` from 2 rows up (33-38 ms at 2-32 rows, against 40-53 ms plus a transposing
copy). Above 32 rows (prefill) plain ``F.linear`` was as fast, and below 16 rows faster
for layer-sized weights, so those calls are left alone.

What it costs: a packed copy of each weight (about 1.27x its bytes), made on the first
call in the packed range and kept while the weight lives (a weak cache keyed by the
weight; an in-place change of the weight repacks it).

What it changes numerically: nothing beyond float summation order. Within the packed range
a row's outputs are bit-identical whatever the other rows hold, because every call has the
same shape; the packed path and ``F.linear`` agree to float rounding (at 32 rows they were
equal in every bit on that host).

Used only on CPU, for float32, with MKL present, and when autograd is off (the packed op
has no backward). ``pack_linears`` turns a module's ``nn.Linear`` layers into
``PackedLinear`` (same parameters, same state dict) and claims its linear and embedding
weights, so that ``vocab_logits`` packs a claimed head weight (a tied one is the
embedding's); an unclaimed weight is never packed there. ``EngineConfig.cpu_packed_linears``
(on by default) applies it to every node an engine loads on CPU.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

PACK_ROWS = 32  # the row count every packed call has
LAYER_MIN_ROWS = 16  # below this, F.linear is faster for layer-sized weights
HEAD_MIN_ROWS = 2  # a vocabulary-sized head gains from 2 rows up (1 row is a GEMV)

# id(weight) -> (a weak reference to it, its version when packed, the packed copy or None
# while claimed but not packed yet). Keyed by identity (tensors compare elementwise); the
# reference's callback drops the entry.
_packed: dict[int, tuple[weakref.ref, int, torch.Tensor | None]] = {}


def available() -> bool:
    """Whether this torch build has MKL's packed linear."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` can take the packed path at all (row count aside)."""
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
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_ROWS)
        _store(weight, weight._version, packed)
    return packed


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the packed weight; ``x`` has at most
    ``PACK_ROWS`` rows (leading dims flattened) and ``usable(x, weight)`` holds."""
    rows = x.numel() // x.shape[-1]
    if not 0 < rows <= PACK_ROWS:
        raise ValueError(f"packed_linear takes 1-{PACK_ROWS} rows, got {rows}")
    flat = x.reshape(rows, x.shape[-1])
    if rows < PACK_ROWS:
        flat = torch.cat([flat, flat.new_zeros(PACK_ROWS - rows, flat.shape[1])])
    else:
        flat = flat.contiguous()
    out = torch.ops.mkl._mkl_linear(flat, _pack(weight), weight, bias, PACK_ROWS)
    return out[:rows].view(*x.shape[:-1], weight.shape[0])


class PackedLinear(nn.Linear):
    """``nn.Linear`` whose 16-32-row calls on CPU use the packed weight (see the module
    docstring); every other call is ``F.linear``. Made by ``pack_linears``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        if LAYER_MIN_ROWS <= rows <= PACK_ROWS and usable(x, self.weight):
            return packed_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def pack_linears(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` under ``module`` whose weight is float32 on CPU into a
    ``PackedLinear`` in place (the object, its parameters and state-dict keys stay; only
    its class changes), and claim those weights and the float32 CPU ``nn.Embedding``
    weights for ``vocab_logits`` (packed lazily, on a first call in range). Returns how
    many linears were changed; 0 where MKL's packed op is missing."""
    if not _AVAILABLE:
        return 0
    changed = 0
    for sub in module.modules():
        if type(sub) not in (nn.Linear, nn.Embedding):
            continue
        weight = sub.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            continue
        if not claimed(weight):
            _store(weight, -1, None)
        if type(sub) is nn.Linear:
            sub.__class__ = PackedLinear
            changed += 1
    return changed


_AVAILABLE = available()
