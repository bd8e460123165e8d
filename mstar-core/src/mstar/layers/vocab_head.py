"""Logits over a large vocabulary for a few rows: ``hidden @ weight.T``, computed in the
orientation that is cheaper on CPU.

``F.linear(h, W)`` with ``W`` [V, H] puts ``W`` on the right of the GEMM. For a decode
step (a few to a few dozen rows) and a vocabulary of 100k+ tokens, MKL then repacks the
whole of ``W`` (hundreds of MB) on every call: on a 2-core CPU, at V = 156,940, H = 512,
that copy was about half of an Orpheus-sized decode step. ``W @ h.T`` puts the small
matrix on the right, so only ``h`` is packed and ``W`` is streamed once; one transposing
copy of the [rows, V] result follows. ``benchmarks/engine_vs_transformers.py`` measures
what it buys end to end. Where ``W`` was claimed by ``pack_linears`` (an engine on CPU does
that unless ``cpu_packed_linears`` is off) and torch has oneDNN, every call takes
``packed_linear`` instead (a packed copy of ``W``, made once, streamed by oneDNN), which was
2-3x faster again on the host of ``mstar.layers.packed_linear``'s figures.

The result equals ``F.linear`` up to float summation order (all are exact dot products of
the same rows, blocked differently). Without a claimed weight, elsewhere (CUDA, one row, a
small vocabulary, many rows as in a long prefill) it is ``F.linear`` itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.layers import packed_linear as packed

# Below this many output columns the repacked matrix is small enough not to matter.
_MIN_VOCAB = 16_384
# Above this many rows (prefill-sized calls) the usual orientation is the better GEMM.
_MAX_ROWS = 256


def vocab_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden`` [..., H] and ``weight`` [V, H] → logits [..., V], as ``F.linear``. A head
    split over tensor-parallel ranks (``mstar.parallel.shard``) holds V / N rows here: the
    ranks' logits are gathered, so every rank gets all V."""
    group = getattr(weight, "mstar_tensor_parallel", None)
    if group is not None:
        return group.all_gather(_logits(hidden, weight, bias), dim=-1)
    return _logits(hidden, weight, bias)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if packed.claimed(weight) and packed.usable(hidden, weight):
        return packed.packed_linear(hidden, weight, bias)
    rows = hidden.numel() // hidden.shape[-1] if hidden.shape[-1] else 0
    if hidden.device.type != "cpu" or weight.shape[0] < _MIN_VOCAB or not 1 < rows <= _MAX_ROWS:
        return F.linear(hidden, weight, bias)
    flat = hidden.reshape(rows, hidden.shape[-1])
    out = torch.mm(weight, flat.t()).t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*hidden.shape[:-1], weight.shape[0])
