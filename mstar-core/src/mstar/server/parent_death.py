"""Children die with the API process: each child process asks the kernel for a signal when
its parent dies (Linux ``PR_SET_PDEATHSIG``), so a crashed or SIGKILLed API process
leaves no preprocess worker or engine behind. Elsewhere (no prctl) it is a no-op; the
engines' own parent check still applies there."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger("mstar.server")

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, parent_pid: int | None) -> bool:
    """Have ``sig`` sent to this process when its parent ends; if ``parent_pid`` (the parent
    expected) is already gone, exit now. True if the kernel took the request."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
        if not armed:
            log.warning("PR_SET_PDEATHSIG unavailable: this process may outlive the API process")
    # The parent may have died before the request was made: then no signal ever comes.
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)
    return armed
