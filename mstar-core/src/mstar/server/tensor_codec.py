"""Tensors on the wire: small ones inline, large ones through shared memory.

A large tensor is written into a fresh ``multiprocessing.shared_memory`` segment whose
name starts with the server's prefix; the receiver copies it out and unlinks it, so a
segment lives only while in flight. ``cleanup_segments`` removes whatever a crash left
behind (the API process calls it at shutdown).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import torch

from mstar.api.tensors import dtype_from_name, dtype_name, tensor_from_bytes, tensor_to_bytes
from mstar.server.messages import TensorMsg

DEFAULT_SHM_THRESHOLD = 64 << 10  # bytes; at or above this a tensor goes through shm
SHM_DIR = Path("/dev/shm")


class TensorCodec:
    def __init__(self, shm_prefix: str, threshold: int = DEFAULT_SHM_THRESHOLD) -> None:
        self.prefix = shm_prefix
        self.threshold = threshold
        self._counter = itertools.count()

    def encode(self, t: torch.Tensor) -> TensorMsg:
        data = tensor_to_bytes(t)
        msg = TensorMsg(dtype_name(t.dtype), list(t.shape))
        if len(data) < self.threshold or not data:
            msg.data = data
            return msg
        name = f"{self.prefix}{os.getpid()}_{next(self._counter)}"
        seg = shared_memory.SharedMemory(name=name, create=True, size=len(data))
        try:
            seg.buf[: len(data)] = data
        finally:
            seg.close()
        # The receiver owns the segment now: keep this process's resource tracker from
        # unlinking it (or warning about a "leak") when this process exits.
        _untrack(seg)
        msg.shm, msg.nbytes = name, len(data)
        return msg

    @staticmethod
    def discard(msg: TensorMsg) -> None:
        """Free the segment of a message that will never be sent (or decoded)."""
        if msg.shm is None:
            return
        with contextlib.suppress(FileNotFoundError):
            seg = shared_memory.SharedMemory(name=msg.shm, create=False)
            seg.close()
            seg.unlink()  # also unregisters it from this process's tracker
        msg.shm = None

    @staticmethod
    def decode(msg: TensorMsg) -> torch.Tensor:
        dtype = dtype_from_name(msg.dtype)
        if msg.shm is None:
            return tensor_from_bytes(msg.data, dtype, msg.shape)
        seg = shared_memory.SharedMemory(name=msg.shm, create=False)
        try:
            data = bytes(seg.buf[: msg.nbytes])
        finally:
            seg.close()
            seg.unlink()  # also unregisters it from this process's tracker
        return tensor_from_bytes(data, dtype, msg.shape)


def _untrack(seg: shared_memory.SharedMemory) -> None:
    # The tracker is an implementation detail: never fail a send on it.
    with contextlib.suppress(Exception):
        resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]


def cleanup_segments(prefix: str) -> int:
    """Unlink every leftover segment whose name starts with ``prefix``; returns the count."""
    removed = 0
    if not SHM_DIR.is_dir():
        return 0
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
