"""Which attention backend runs on a device, and building it over a KV cache."""

from __future__ import annotations

import functools
from typing import Literal

import torch

from mstar.attention.backend import AttentionBackend
from mstar.attention.flashinfer_backend import FLASHINFER_DTYPES, FlashInferAttentionBackend
from mstar.attention.torch_backend import TorchAttentionBackend
from mstar.kv.cache_manager import KVCacheManager

BackendName = Literal["torch", "flashinfer"]
BACKEND_NAMES: tuple[BackendName, ...] = ("torch", "flashinfer")


@functools.cache
def flashinfer_import_error() -> str | None:
    """Why flashinfer cannot be imported, or None when it can (checked once per process)."""
    try:
        import flashinfer  # noqa: F401  (optional extra; imported only on this path)
    except (
        Exception
    ) as exc:  # a broken CUDA install raises OSError/RuntimeError, not only ImportError
        return f"{type(exc).__name__}: {exc}"
    return None


def flashinfer_available() -> bool:
    return flashinfer_import_error() is None


def select_backend(device: torch.device | str, override: str | None = None) -> BackendName:
    """Name of the backend to use on ``device``.

    CPU (and other non-CUDA devices) get ``torch``; CUDA gets ``flashinfer`` when the
    optional ``mstar-core[cuda]`` extra is installed, else ``torch``. ``override`` forces one.
    """
    device = torch.device(device)
    if override is not None:
        if override not in BACKEND_NAMES:
            raise ValueError(
                f"unknown attention backend {override!r}; choose one of {list(BACKEND_NAMES)}"
            )
        if override == "flashinfer":
            _require_flashinfer(device)
        return override  # type: ignore[return-value]
    if device.type == "cuda" and flashinfer_available():
        return "flashinfer"
    return "torch"


def create_backend(kv: KVCacheManager, override: str | None = None) -> AttentionBackend:
    """The backend for ``kv``'s device (see ``select_backend``), constructed over ``kv``.

    Without an override, a cache dtype flashinfer cannot serve falls back to ``torch``.
    """
    name = select_backend(kv.device, override)
    # An automatic choice must not fail on a cache dtype flashinfer lacks (e.g. fp32); an
    # explicit override still gets flashinfer's clear error.
    if name == "flashinfer" and (override is not None or kv.dtype in FLASHINFER_DTYPES):
        return FlashInferAttentionBackend(kv)
    return TorchAttentionBackend(kv)


def _require_flashinfer(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"attention backend 'flashinfer' needs a CUDA device, got {device}")
    error = flashinfer_import_error()
    if error is not None:
        raise ImportError(
            f"attention backend 'flashinfer' was requested but flashinfer cannot be imported "
            f"({error}); install the CUDA extra: pip install 'mstar-core[cuda]'"
        )
