"""Matrix products whose bits do not depend on the number of threads that compute them.

On x86 CPUs torch's ``F.linear``/``matmul`` call MKL's ``sgemm``. By default MKL may split
a product's reduction across threads, so one product computed with 1 and with 2 threads
can differ in the last bits; on AMD EPYC hosts it does, for some row counts (e.g. 5 or 10
rows against a [2048, 512] weight). The engine runs a node's forwards with a thread count
that depends on ``overlap_nodes`` (``EngineConfig.cpu_threads``), so without a fix the
seeded output of a model that runs a codec beside its LM would depend on that setting and
on the host.

MKL's strict Conditional Numerical Reproducibility mode (``MKL_CBWR=AUTO,STRICT``: the
best code path for the CPU, results independent of the thread count) removes that. MKL
reads the setting once, before its first call, and refuses to change it later; so
``import mstar`` sets the variable (unless the user set one) before anything of mstar
imports torch, and engine processes inherit it. Measured on a 2-core AMD EPYC host
(2026-12-04): no slower than the default mode for linears of 1-512 rows.

What it does not give: the same bits on another CPU model (MKL picks a code path per
instruction set), nor for oneDNN or torch kernels that are not MKL; those the engine's
tests check directly (``tests/core/test_blas_reproducibility.py``).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MKL_CBWR = "AUTO,STRICT"
_MKL_CBWR_ALL = -1  # mkl_cbwr_get's argument for the whole setting: code path and flags
_MKL_CBWR_STRICT = 0x10000


def request_strict_mode() -> None:
    """Ask MKL for thread-count independent results (effective if MKL has not run yet)."""
    os.environ.setdefault("MKL_CBWR", MKL_CBWR)


def strict_mode_active() -> bool | None:
    """Whether MKL computes products independently of the thread count in this process;
    None when torch does not use MKL (or its mode cannot be read)."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_int
    return bool(get(_MKL_CBWR_ALL) & _MKL_CBWR_STRICT)


def warn_if_thread_dependent() -> None:
    """Log once per process when MKL runs in its default mode (it ran before ``import mstar``
    set ``MKL_CBWR``, or the user chose another mode)."""
    global _warned
    if _warned or strict_mode_active() is not False:
        return
    _warned = True
    log.warning(
        "MKL is not in its strict reproducibility mode (MKL_CBWR=%s), so a product's last bits "
        "may depend on the thread count and seeded outputs on overlap_nodes/cpu_threads; "
        "import mstar before running torch code, or set MKL_CBWR=%s in the environment",
        os.environ.get("MKL_CBWR", "unset"),
        MKL_CBWR,
    )


_warned = False
