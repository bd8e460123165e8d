"""The attention of compiled layer stacks in C++ (``mstar_native::paged_attention``,
``mstar.native``).

Run in C++: a decode step that the torch backend serves from its decode buffer
(``TorchAttentionBackend.native_decode_step``), with the activations in the cache's dtype:
the cache and buffer writes and the SDPA call of ``TorchAttentionBackend.run``, the same ATen
ops in the same order, so the same outputs and caches bit for bit. Any other step, or a
backend without this state (FlashInfer, a test's stand-in), runs the backend's Python ``run``,
called from the op.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def bind(module: ModuleType, backend: Any) -> None:
    """Bind ``backend``'s planned step on this thread for the ops of one compiled call."""
    step_of = getattr(backend, "native_decode_step", None)
    module.bind_attention(backend.run, step_of() if step_of is not None else None)


def unbind(module: ModuleType, backend: Any) -> None:
    """Clear the binding, and tell the backend which layers the C++ op wrote."""
    written = module.unbind_attention()
    if written:
        backend.native_layers_written(written)
