"""Checkpoints saved with weight norm: each (magnitude g, direction v) pair is read as the
plain ``weight = g * v / ||v||`` that a module without the parametrization holds."""

from __future__ import annotations

import torch

from mstar.weights.sources import Index, TensorSource

# (magnitude suffix, direction suffix) of torch's two weight-norm implementations.
WEIGHT_NORM_SUFFIXES = (
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),  # torch >= 2.1
    (".weight_g", ".weight_v"),  # the legacy torch.nn.utils.weight_norm
)


class WeightNormFolded:
    """``source`` with every complete (g, v) pair replaced by one ``<base>.weight`` key,
    computed in float32 when read. A lone g or v stays as it is (the strict load reports
    it as unexpected)."""

    def __init__(self, source: TensorSource) -> None:
        self.source = source
        self.where = source.where
        keys = source.keys()
        have = set(keys)
        self._pairs: dict[str, tuple[str, str]] = {}  # folded key -> (g key, v key)
        for key in keys:
            for g_suffix, v_suffix in WEIGHT_NORM_SUFFIXES:
                base = key.removesuffix(g_suffix)
                if base != key and base + v_suffix in have:
                    self._pairs[base + ".weight"] = (key, base + v_suffix)
        folded = {k for pair in self._pairs.values() for k in pair}
        self._keys = [k for k in keys if k not in folded] + list(self._pairs)

    def keys(self) -> list[str]:
        return list(self._keys)

    def shape(self, key: str) -> tuple[int, ...]:
        pair = self._pairs.get(key)
        return self.source.shape(pair[1] if pair else key)

    def read(self, key: str, index: Index = ()) -> torch.Tensor:
        pair = self._pairs.get(key)
        if pair is None:
            return self.source.read(key, index)
        g, v = (self.source.read(k).float() for k in pair)
        weight = _weight_norm(g, v)
        return weight[index] if index else weight

    def close(self) -> None:
        self.source.close()


def _weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # torch's own kernel when present: the bits its weight_norm computes (norm over every
    # dim but 0, torch's default).
    if hasattr(torch, "_weight_norm"):
        return torch._weight_norm(v, g, 0)
    return v * (g / v.norm(dim=tuple(range(1, v.dim())), keepdim=True))
