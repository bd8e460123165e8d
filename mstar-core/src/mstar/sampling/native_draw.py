"""The draws of compiled regions in C++ (``mstar_native::draw_aux`` and
``mstar_native::draw_main``, ``mstar.native``).

Drawn in C++: a batch whose rows all sample the label with top_k alone (no top_p or min_p),
the path ``draw._draw_top_k`` takes for a TTS codebook, with the same ATen ops in the same
order and the same step counters, so the Python sampler's tokens bit for bit; an aux label
without penalties or stop ids, the main label also with them (its penalty terms and stop
mask computed here at bind time, the op applying them as ``kernel.sample_batch`` does). A
batch with any other row, or a sampler without this state, is drawn by the Python sampler,
called from the op.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

_lock = threading.Lock()
_label_ids: dict[str, int] = {}
_labels: list[str] = []  # by id


@torch.compiler.assume_constant_result  # called while a region traces: run it, keep its result
def label_id(label: str) -> int:
    """The op's integer for ``label`` (the op's schema takes no strings), fixed per process."""
    with _lock:
        if label not in _label_ids:
            _label_ids[label] = len(_labels)
            _labels.append(label)
        return _label_ids[label]


def bind(module: ModuleType, sampler: Any, main: bool = True) -> None:
    """Bind ``sampler``'s draws on this thread for the aux labels it declares (``aux_labels``), and
    for any other on its first draw: each label's top-k rows where its sampler offers them
    for this batch (``native_top_k_rows``), and always its Python ``sample_aux`` as the
    fallback; the same for the main label (``native_main_rows``, ``sample``), its rows only
    with ``main`` (a caller whose region makes no main draw skips gathering them)."""
    rows_of = getattr(sampler, "native_top_k_rows", None)

    def entry(i: int) -> tuple[Any, Any]:
        label = _labels[i]
        return _Fallback(sampler, label), rows_of(label) if rows_of is not None else None

    for label in sorted(getattr(sampler, "aux_labels", ())):
        label_id(label)
    module.bind_draws([entry(i) for i in range(len(_labels))], entry)
    main_rows = getattr(sampler, "native_main_rows", None)
    module.bind_main(_MainFallback(sampler), main_rows() if main and main_rows is not None else None)


def unbind(module: ModuleType, sampler: Any) -> None:
    """Clear this thread's draws; where the main draw ran in C++, tell ``sampler``
    (``native_main_drawn``: its seen sets and ``last_main_tokens``)."""
    tokens = module.unbind_draws()
    if tokens is not None:
        sampler.native_main_drawn(tokens)


class _MainFallback:
    """``sampler.sample(logits).tokens``, as the op calls it."""

    __slots__ = ("sampler",)

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __call__(self, logits: Tensor) -> Tensor:
        return self.sampler.sample(logits).tokens


class _Fallback:
    """``sampler.sample_aux(label, logits).tokens``, as the op calls it."""

    __slots__ = ("label", "sampler")

    def __init__(self, sampler: Any, label: str) -> None:
        self.sampler, self.label = sampler, label

    def __call__(self, logits: Tensor) -> Tensor:
        return self.sampler.sample_aux(self.label, logits).tokens
