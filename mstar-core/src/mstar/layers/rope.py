"""Rotary position embeddings (rotate-half layout) and the frequency variants HF configs name.

``rope_type`` ``default``, ``linear`` (positions divided by ``factor``) and ``llama3``
(long wavelengths divided by ``factor``, a linear blend between ``low_freq_factor`` and
``high_freq_factor``). Parameters come from a config's ``rope_parameters`` (transformers 5)
or ``rope_theta`` + ``rope_scaling`` (older checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

DEFAULT_THETA = 10000.0
ROPE_TYPES = ("default", "linear", "llama3")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the rotate-half layout (first and second half of each head)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    # On the CPU explicitly: modules may be built under a meta-device context.
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / theta**exponents


def llama3_inv_freq(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's RoPE parameters in one form: ``{"rope_type", "rope_theta", ...}``."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", DEFAULT_THETA))
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    return params


def inv_freq_for(dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    kind = params.get("rope_type", "default")
    inv_freq = default_inv_freq(dim, float(params.get("rope_theta", DEFAULT_THETA)))
    if kind == "linear":
        return inv_freq / float(params["factor"])
    if kind == "llama3":
        return llama3_inv_freq(inv_freq, params)
    if kind != "default":
        raise ValueError(f"unsupported rope_type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    return inv_freq


class RotaryEmbedding:
    """cos/sin for absolute positions, computed per step (no position-sized table)."""

    def __init__(self, head_dim: int, params: Mapping[str, Any] | None = None) -> None:
        params = dict(params or {})
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported")
        self.inv_freq = inv_freq_for(head_dim, params)
        self._on: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], head_dim: int) -> RotaryEmbedding:
        return cls(head_dim, rope_parameters(config))

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin of shape [T, 1, head_dim] (broadcast over heads)."""
        inv = self._on.get(positions.device)
        if inv is None:
            inv = self._on[positions.device] = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
