"""A model's layer stack compiled by ``torch.compile``, its paged attention left to the engine.

The attention backend is Python with per-step plans (block tables, decode buffers), which
``torch.compile`` cannot trace and should not specialise on. ``compile_with_attention``
compiles ``fn(attention, *args)`` whole with a stand-in for ``attention`` whose ``run`` is an
opaque custom op (``mstar::paged_attention``) calling the step's real backend, bound for the
call on this thread: the same KV writes and the same attention as eager, while the rest of
each layer (norms, projections, rotary embedding, MLP) becomes a few fused kernels. Where
``mstar.native`` is built the op is ``mstar_native::paged_attention`` instead, which serves a
decode step over the torch backend's decode buffer in C++ (no GIL) and calls the backend for
anything else.

Ordering: a layer's attention reads its own inputs and the cache of that layer only, and
each layer's output feeds the next, so data orders every call; none is unused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mstar.attention import native_attention
from mstar.compile_bound import ThreadBinding, compile_bound
from mstar.native import native_module

_backend = ThreadBinding("backend")


@torch.library.custom_op("mstar::paged_attention", mutates_args=())
def _paged_attention(q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
    return _backend.get().run(layer, q, k, v)


@_paged_attention.register_fake
def _paged_attention_fake(q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
    return torch.empty_like(q)  # [T, Hq, D]: one output per query token and head


class _OpAttention:
    """What a compiled layer stack sees as its attention backend."""

    def __init__(self, native: bool) -> None:
        self._native = native

    def run(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self._native:
            return torch.ops.mstar_native.paged_attention(q, k, v, layer)
        return torch.ops.mstar.paged_attention(q, k, v, layer)


def compile_with_attention(fn: Callable[..., Any], *, cpp_wrapper: bool = False) -> Callable[..., Any]:
    """``fn(attention, *args)`` (``attention``: the step's planned backend, used only through
    ``attention.run(layer, q, k, v)``) compiled whole (``mstar.compile_bound``), called the
    same way; the attention ops call ``attention``, bound for the call."""
    native = native_module()
    stand_in = _OpAttention(native is not None)

    def stack(*args: Any) -> Any:
        return fn(stand_in, *args)

    compiled = compile_bound(stack, _backend, cpp_wrapper=cpp_wrapper)
    if native is None:
        return compiled

    def run(backend: Any, *args: Any) -> Any:
        native_attention.bind(native, backend)
        try:
            return compiled(backend, *args)
        finally:
            native_attention.unbind(native, backend)

    return run
