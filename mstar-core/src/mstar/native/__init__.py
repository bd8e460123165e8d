"""C++ ops for regions compiled with inductor's C++ wrapper, built on first use.

Inside such a region an op whose kernel is Python takes the GIL back for each call (while the
codec's worker thread may hold it) and runs its Python with cold caches: for a Qwen3-TTS
frame, its main and code-predictor draws and its talker layers' attention cost more that way than
the kernels around them. Three ops have C++ kernels for their common case, running the same
ATen ops in the same order as the Python they stand for (so the same bits):

- ``mstar_native::draw_aux`` and ``mstar_native::draw_main`` (``mstar.sampling.native_draw``):
  a draw whose batch rows all sample with top_k alone (a main draw also with penalties and
  min_tokens stop ids);
- ``mstar_native::paged_attention`` (``mstar.attention.native_attention``): a decode step
  served by the torch backend's decode buffer.

Anything else calls the Python sampler or backend from the op. The extension is compiled with
``torch.utils.cpp_extension.load`` (a C++ compiler and ninja, which inductor's C++ wrapper
needs anyway; about 30-60 s on two cores, then cached by torch across processes). Where it
cannot be built, or with ``MSTAR_NATIVE_OPS=0``, regions keep the Python ops
(``mstar::draw_main``, ``mstar::draw_aux``, ``mstar::paged_attention``) and a warning says why.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = [_HERE / "module.cpp", _HERE / "draws.cpp", _HERE / "paged_attention.cpp"]
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}


def native_module() -> ModuleType | None:
    """The built extension (the ops' per-thread ``bind_*``/``unbind_*``; the ops themselves
    are ``torch.ops.mstar_native``), or None where it is turned off or cannot be built."""
    with _lock:
        if "module" not in _loaded:
            _loaded["module"] = _build()
        return _loaded["module"]


def _build() -> ModuleType | None:
    if os.environ.get("MSTAR_NATIVE_OPS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        module = load(name="mstar_native", sources=[str(s) for s in SOURCES], extra_cflags=["-O2"], verbose=False)
    except Exception as e:  # no compiler or ninja, a failed build
        log.warning("mstar's native ops could not be built (%s); compiled regions call Python for draws and attention", e)
        return None

    @torch.library.register_fake("mstar_native::draw_aux")
    def _draw_fake(logits: Tensor, label: int, after: Tensor | None) -> Tensor:
        return logits.new_empty(logits.shape[:-1], dtype=torch.int64)

    @torch.library.register_fake("mstar_native::draw_main")
    def _main_fake(logits: Tensor, after: Tensor | None) -> Tensor:
        return logits.new_empty(logits.shape[:-1], dtype=torch.int64)

    @torch.library.register_fake("mstar_native::paged_attention")
    def _attention_fake(q: Tensor, k: Tensor, v: Tensor, layer: int) -> Tensor:
        return torch.empty_like(q)

    return module
