"""The attention-backend interface (the choice of backend per device: ``selection``)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from mstar.attention.cross import CrossAttentionBatch
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
        window: int | None = None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` [T, Hkv, D] into the layer's cache at the planned slots, then
        attend ``q`` [T, Hq, D] over each row's whole cached K/V. Returns [T, Hq, D].

        ``scale`` defaults to ``1/sqrt(D)``; ``Hq`` must be a multiple of ``Hkv`` (GQA).
        ``window``: a sliding-window layer's queries see only the ``window`` keys ending at
        themselves (transformers' ``sliding_window``); None: all of the row's keys. The cache
        still holds every position.
        """

    def plan_cross(self, batch: CrossAttentionBatch) -> None:
        """Prepare the step's cross-attention (nodes whose layout names a cross-attention
        signal; ``mstar.attention.cross``); valid until the next ``plan_cross``."""
        raise NotImplementedError(f"the {self.name} attention backend has no cross-attention")

    def cross(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Attend ``q`` [T, Hq, D] (the step's tokens, as in ``run``) over each row's whole
        cross-attention cache, with no causal rule. ``k``/``v`` [S, Hkv, D]: the cross K/V of
        the rows that write theirs this step (``engine_inputs.cross_states`` projected),
        given exactly when some row writes; None on every later step. Returns [T, Hq, D]."""
        raise NotImplementedError(f"the {self.name} attention backend has no cross-attention")
