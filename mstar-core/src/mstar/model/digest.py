"""A digest of tensors' exact contents: equal digests mean equal dtypes, shapes and bytes.
For cache keys (``NodeSubmodule.output_cache_key``, ``ARNodeSubmodule.prefix_cache_keys``)."""

from __future__ import annotations

import hashlib

import torch


def tensor_digest(*tensors: torch.Tensor) -> bytes:
    """16-byte BLAKE2b over each tensor's dtype, shape and bytes (read on the CPU)."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        t = t.detach()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        data = t.to("cpu").contiguous()
        # bfloat16 and friends have no numpy dtype: hash their raw bytes as unsigned ints.
        h.update(data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b"")
    return h.digest()
