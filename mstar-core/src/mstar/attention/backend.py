"""The attention-backend interface (the choice of backend per device: ``selection``)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from mstar.attention.metadata import AttentionBatch
from mstar.kv.cache_manager import KVCacheManager


class AttentionBackend(ABC):
    """Paged attention over one node's KV cache.

    Per engine step: ``plan(batch)`` once, then ``run(layer, ...)`` for every layer. ``plan``
    does all per-step work (indices, masks, kernel plans) so ``run`` stays a fixed sequence
    of tensor ops per layer.
    """

    name: str

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv

    @abstractmethod
    def plan(self, batch: AttentionBatch) -> None:
        """Prepare the step described by ``batch``; valid until the next ``plan``."""

    @abstractmethod
    def run(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` [T, Hkv, D] into the layer's cache at the planned slots, then
        attend ``q`` [T, Hq, D] over each row's whole cached K/V. Returns [T, Hq, D].

        ``scale`` defaults to ``1/sqrt(D)``; ``Hq`` must be a multiple of ``Hkv`` (GQA).
        """
