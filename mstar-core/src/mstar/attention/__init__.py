"""Attention backends over the paged KV cache: plan once per step, run per layer."""

from mstar.attention.backend import AttentionBackend
from mstar.attention.metadata import AttentionBatch, AttentionRow
from mstar.attention.selection import create_backend, flashinfer_available, select_backend
from mstar.attention.torch_backend import TorchAttentionBackend

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "AttentionRow",
    "TorchAttentionBackend",
    "create_backend",
    "flashinfer_available",
    "select_backend",
]
