"""Rotary embeddings with Llama-3 frequency scaling (``rope_type: llama3``).

Llama 3.1+ stretch long wavelengths: wavelengths beyond ``original_max / low_freq_factor``
are divided by ``factor``, those below ``original_max / high_freq_factor`` are kept, and
the band between is interpolated linearly in ``original_max / wavelength``.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # Explicitly on CPU: modules may be built under a meta-device context before loading.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    return 1.0 / theta**exponents


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


class RotaryEmbedding:
    """cos/sin for absolute positions, computed per step (no position-sized table)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        inv_freq = default_inv_freq(head_dim, theta)
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, scaling or {})
        elif kind != "default":
            raise ValueError(f"unsupported rope scaling {kind!r} (supported: default, llama3)")
        self.inv_freq = inv_freq
        self._on: dict[torch.device, torch.Tensor] = {}

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin of shape [T, 1, head_dim] (broadcast over heads)."""
        inv = self._on.get(positions.device)
        if inv is None:
            inv = self._on[positions.device] = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
