"""``torch.compile`` of a function whole, with one Python object (a sampler, an attention
backend) left outside the graph: inside, custom ops reach it through a per-thread binding
that the compiled function's caller sets for the call.

Shared by ``mstar.sampling.compiled_region`` and ``mstar.attention.compiled_layers``.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any


class ThreadBinding(threading.local):
    """The object the ops of a compiled call use, on the thread that runs the call."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.value: Any = None

    def get(self) -> Any:
        if self.value is None:
            raise RuntimeError(f"a compiled graph ran with no {self.what} bound (call it through its compiled wrapper)")
        return self.value


def compile_bound(fn: Callable[..., Any], binding: ThreadBinding, *, cpp_wrapper: bool = False) -> Callable[..., Any]:
    """``fn(*args)`` compiled whole (``fullgraph``: a graph break is an error, not a silent
    fallback), returned as ``run(bound, *args)``, which binds ``bound`` to ``binding`` for
    the call. Shapes compile on first use, and a dimension that changes is made dynamic,
    as ``torch.compile`` does by default. ``cpp_wrapper``: inductor's C++ wrapper, which
    runs the graph's kernels without the GIL (another Python thread runs meanwhile; ops
    that call back into Python take it back)."""
    import torch

    # Dynamo keeps its graphs per code object, up to a recompile limit (8): one code object
    # per compiled function keeps functions (and engines in one process) from sharing one.
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(own, fullgraph=True, options={"cpp_wrapper": True} if cpp_wrapper else {})

    def run(bound: Any, *args: Any) -> Any:
        before = binding.value
        binding.value = bound
        try:
            return compiled(*args)
        finally:
            binding.value = before

    return run
