"""Rotary position embeddings (rotate-half layout) and the frequency variants HF configs name.

Parameters come from a config's ``rope_parameters`` (transformers 5) or ``rope_theta`` +
``rope_scaling`` (older checkpoints), normalised by ``rope_parameters``. ``rope_type``:

- ``default``: ``theta ** (-2i / dim)``;
- ``linear``: every frequency divided by ``factor``;
- ``llama3``: wavelengths above ``original_max_position_embeddings / low_freq_factor``
  divided by ``factor``, below ``.../ high_freq_factor`` kept, a linear blend between;
- ``yarn``: per frequency, a ramp from extrapolated (kept) to interpolated (divided by
  ``factor``) between the ``beta_fast``/``beta_slow`` rotation counts over
  ``original_max_position_embeddings``; cos/sin scaled by ``attention_factor``
  (``0.1 ln(factor) + 1`` unless given, or the ``mscale``/``mscale_all_dim`` ratio);
- ``longrope``: frequencies divided by ``short_factor`` (one per frequency) or
  ``long_factor``; cos/sin scaled by ``attention_factor`` (``sqrt(1 + ln f / ln L0)``
  with ``f = max_position_embeddings / L0`` unless given);
- ``dynamic`` (NTK): ``theta`` grown with the sequence length ``s`` past
  ``max_position_embeddings`` ``M``: ``theta * (factor * s / M - factor + 1) ** (dim / (dim - 2))``.

Where transformers recomputes per forward call, this module decides **per token**, so a
token's rotation never depends on its batch or on how its prompt was chunked, and a key is
rotated once when it enters the paged cache:

- ``longrope``: transformers uses the long factors for *every* position of a call whose
  longest sequence exceeds ``original_max_position_embeddings`` (L0), the short ones
  otherwise. Here a token at position ``p`` uses the long factors when ``p >= L0`` and the
  short ones below. Equal for any sequence of at most L0 tokens and for every token decoded
  one at a time; a prompt longer than L0 differs from transformers on its first L0 positions.
- ``dynamic``: transformers recomputes the frequencies for the call's sequence length (the
  longest position + 1) when it grows past ``M``. Here position ``p`` uses ``s = max(p + 1, M)``:
  equal for sequences of at most ``M`` tokens and for tokens decoded one at a time; a prompt
  longer than ``M`` differs from transformers on its earlier positions.

``partial_rotary_factor`` < 1 rotates the first ``int(head_dim * factor)`` dims of each head
and passes the rest through (Phi-3, GPT-NeoX style).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

DEFAULT_THETA = 10000.0
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
# transformers moves the pretraining length into the parameters for these types.
_NEED_ORIGINAL = ("llama3", "yarn", "longrope")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the rotate-half layout (first and second half of the rotated
    dims). ``cos``/``sin`` may cover fewer dims than ``x`` (partial rotary): the first
    ``cos.shape[-1]`` dims are rotated, the rest pass through unchanged."""
    d = cos.shape[-1]
    if d != x.shape[-1]:
        return torch.cat([apply_rope(x[..., :d], cos, sin), x[..., d:]], dim=-1)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with the first half of its last dim negated: ``rotate``'s sine table."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``apply_rope(x, cos, sin)`` (whole head) with ``sin_signed = signed_sin(sin)``, in
    fewer ops: rotate-half is the halves swapped (one ``roll``) with the first half negated,
    and the negation moves into the table exactly ((-a) * b == a * (-b) in IEEE arithmetic).
    For steps of many small ops (a TTS code predictor's depth loop)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's RoPE parameters in one form: ``{"rope_type", "rope_theta", ...}``, with
    a top-level ``partial_rotary_factor`` moved in, and for llama3/yarn/longrope the
    pretraining length ``original_max_position_embeddings`` (a top-level value wins, as
    Phi-3 stores it; else ``max_position_embeddings``), as transformers reads them."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", DEFAULT_THETA))
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    if config.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    if params["rope_type"] in _NEED_ORIGINAL:
        if config.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        elif config.get("max_position_embeddings") is not None:
            params.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    return params


def _exponents(dim: int) -> torch.Tensor:
    # On the CPU explicitly: modules may be built under a meta-device context.
    return torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** _exponents(dim)


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


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, params: Mapping[str, Any], max_positions: int | None) -> tuple[torch.Tensor, float]:
    theta, original = float(params["rope_theta"]), float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    factor = float(factor) if factor is not None else _required(max_positions, "yarn") / original
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all else _yarn_mscale(factor)
    fast, slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def dim_for(rotations: float) -> float:  # the dim index that turns `rotations` times over `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(fast), dim_for(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** _exponents(dim)
    kept = 1 - ramp  # weight of the extrapolated (unscaled) frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept
    return inv, float(attention)


def _longrope_attention(params: Mapping[str, Any], max_positions: int | None) -> float:
    original = float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    factor = float(factor) if factor is not None else _required(max_positions, "longrope") / original
    given = params.get("attention_factor")
    if given is not None:
        return float(given)
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _required(max_positions: int | None, kind: str) -> float:
    if max_positions is None:
        raise ValueError(f"rope_type {kind!r} needs max_position_embeddings (RotaryEmbedding.from_config passes it)")
    return float(max_positions)


def inv_freq_for(dim: int, params: Mapping[str, Any], max_positions: int | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [dim / 2] and the cos/sin scale of ``params``' static part (for
    longrope the short factors, for dynamic the unscaled base)."""
    kind = params.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    theta = float(params.get("rope_theta", DEFAULT_THETA))
    if kind == "yarn":
        return yarn_inv_freq(dim, params, max_positions)
    if kind == "longrope":
        short = torch.tensor(params["short_factor"], dtype=torch.float32, device="cpu")
        return 1.0 / (short * theta ** _exponents(dim)), _longrope_attention(params, max_positions)
    inv_freq = default_inv_freq(dim, theta)
    if kind == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if kind == "llama3":
        return llama3_inv_freq(inv_freq, params), 1.0
    return inv_freq, 1.0


class RotaryEmbedding:
    """cos/sin for absolute positions, computed per step (no position-sized table).

    ``head_dim``: the attention head size; ``params``: ``rope_parameters(config)``;
    ``max_position_embeddings``: the config's, needed by ``dynamic`` (and by yarn/longrope
    without a ``factor``). ``rotary_dim`` = ``int(head_dim * partial_rotary_factor)``.
    """

    def __init__(self, head_dim: int, params: Mapping[str, Any] | None = None, max_position_embeddings: int | None = None) -> None:
        params = dict(params or {})
        self.rotary_dim = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= head_dim:
            raise ValueError(f"rotary dims {self.rotary_dim} (head_dim {head_dim} x partial_rotary_factor) must be even and in (0, head_dim]")
        self.inv_freq, self.attention_factor = inv_freq_for(self.rotary_dim, params, max_position_embeddings)
        self.kind = params.get("rope_type", "default")
        self.switch_at: int | None = None  # longrope: first position on the long factors
        self.long_inv_freq: torch.Tensor | None = None
        if self.kind == "longrope":
            self.switch_at = int(params["original_max_position_embeddings"])
            long = torch.tensor(params["long_factor"], dtype=torch.float32, device="cpu")
            self.long_inv_freq = 1.0 / (long * float(params["rope_theta"]) ** _exponents(self.rotary_dim))
        elif self.kind == "dynamic":
            self.switch_at = int(_required(max_position_embeddings, "dynamic"))
            self.theta, self.factor = float(params["rope_theta"]), float(params["factor"])
        self._on: dict[tuple[str, torch.device], torch.Tensor] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], head_dim: int) -> RotaryEmbedding:
        return cls(head_dim, rope_parameters(config), config.get("max_position_embeddings"))

    def _table(self, name: str, device: torch.device) -> torch.Tensor:
        key = (name, device)
        t = self._on.get(key)
        if t is None:
            t = self._on[key] = getattr(self, name).to(device)
        return t

    def _freqs(self, positions: torch.Tensor) -> torch.Tensor:
        pos = positions.to(torch.float32)[..., None]
        inv = self._table("inv_freq", positions.device)
        if self.switch_at is None:
            return pos * inv
        beyond = (positions >= self.switch_at)[..., None]
        if self.long_inv_freq is not None:
            return pos * torch.where(beyond, self._table("long_inv_freq", positions.device), inv)
        # dynamic: each position's own base for the sequence length it closes (>= M).
        dim, m = self.rotary_dim, float(self.switch_at)
        seq = (positions.to(torch.float32) + 1).clamp(min=m)
        base = self.theta * (self.factor * seq / m - (self.factor - 1)) ** (dim / (dim - 2))
        grown = 1.0 / base[..., None] ** _exponents(dim).to(positions.device)
        return pos * torch.where(beyond, grown, inv)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of any shape -> cos, sin of shape [*positions.shape, rotary_dim]
        (angles in float32, scaled by ``attention_factor``, then cast to ``dtype``)."""
        freqs = self._freqs(positions)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin of shape [T, 1, rotary_dim] (broadcast over heads)."""
        cos, sin = self.cos_sin(positions, dtype)
        return cos[:, None, :], sin[:, None, :]
