"""Aux draws of compiled regions without Python: the C++ op ``mstar_native::draw_aux``.

Inside a region compiled with inductor's C++ wrapper, an op whose kernel is Python takes the
GIL back for each call (while the codec's worker thread may hold it) and runs the sampler's
Python with cold caches: for a Qwen3-TTS frame that is most of the cost of its seven
small-vocabulary draws. ``native/aux_draw.cpp`` draws the common case in C++: every row of
the batch samples its label with top_k alone (no top_p, min_p, penalties or stop ids), the
path ``draw._draw_top_k`` takes for a TTS codebook. It runs the same ATen ops in the same
order as that Python path and advances the same step counters, so its tokens are the
Python sampler's bit for bit. A batch with any other row, or a sampler without this state,
is drawn by the Python sampler, called from the op.

The extension is compiled on first use with ``torch.utils.cpp_extension.load`` (a C++
compiler and ninja, as inductor's C++ wrapper needs anyway; ~1 minute, then cached by
torch across processes). Where it cannot be built, or with ``MSTAR_NATIVE_DRAWS=0``, the
regions keep the Python op (``mstar::draw_aux``) and a warning says why.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("native") / "aux_draw.cpp"
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}
_label_ids: dict[str, int] = {}
_labels: list[str] = []  # by id


def native_module() -> ModuleType | None:
    """The built extension (its ``bind``/``unbind``; the op is ``torch.ops.mstar_native``),
    or None where it is turned off or cannot be built."""
    with _lock:
        if "module" not in _loaded:
            _loaded["module"] = _build()
        return _loaded["module"]


def _build() -> ModuleType | None:
    if os.environ.get("MSTAR_NATIVE_DRAWS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        module = load(name="mstar_native_aux_draw", sources=[str(_SOURCE)], extra_cflags=["-O2"], verbose=False)
    except Exception as e:  # no compiler or ninja, a failed build
        log.warning("the native aux draw could not be built (%s); compiled regions draw through Python", e)
        return None

    @torch.library.register_fake("mstar_native::draw_aux")
    def _fake(logits: Tensor, label: int, after: Tensor | None) -> Tensor:
        return logits.new_empty(logits.shape[:-1], dtype=torch.int64)

    return module


@torch.compiler.assume_constant_result  # called while a region traces: run it, keep its result
def label_id(label: str) -> int:
    """The op's integer for ``label`` (the op's schema takes no strings), fixed per process."""
    with _lock:
        if label not in _label_ids:
            _label_ids[label] = len(_labels)
            _labels.append(label)
        return _label_ids[label]


def bind(module: ModuleType, sampler: Any) -> None:
    """Bind ``sampler``'s draws on this thread for the aux labels it declares (``aux_labels``), and
    for any other on its first draw: each label's top-k rows where its sampler offers them
    for this batch (``native_top_k_rows``), and always its Python ``sample_aux`` as the
    fallback."""
    rows_of = getattr(sampler, "native_top_k_rows", None)

    def entry(i: int) -> tuple[Any, Any]:
        label = _labels[i]
        return _Fallback(sampler, label), rows_of(label) if rows_of is not None else None

    for label in sorted(getattr(sampler, "aux_labels", ())):
        label_id(label)
    module.bind([entry(i) for i in range(len(_labels))], entry)


class _Fallback:
    """``sampler.sample_aux(label, logits).tokens``, as the op calls it."""

    __slots__ = ("label", "sampler")

    def __init__(self, sampler: Any, label: str) -> None:
        self.sampler, self.label = sampler, label

    def __call__(self, logits: Tensor) -> Tensor:
        return self.sampler.sample_aux(self.label, logits).tokens
