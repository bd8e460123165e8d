"""The code predictor: a small autoregressive model over one frame's residual codebook
groups, run inside the talker's step once the first codebook is sampled.

For a frame it reads [talker hidden state, embedding of the first code], then feeds each
sampled residual code back, with a fresh short cache per frame. Every residual code is
drawn by the auxiliary sampler label the plugin declares.
"""

from __future__ import annotations

from typing import Any

import torch
from mstar.layers import RMSNorm, RotaryEmbedding, signed_sin
from torch import nn

from mstar_qwen3tts.config import PredictorConfig
from mstar_qwen3tts.transformer import DecoderLayer

AUX_LABEL = "code_predictor"


class PredictorModel(nn.Module):
    def __init__(self, cfg: PredictorConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Residual groups 1..G-1 are embedded in the talker's width (they are summed into
        # its next input), then projected to the predictor's width.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = PredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        # Present only where the widths differ (the 1.7B talker feeds a 1024-wide predictor).
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True) if talker_hidden != cfg.hidden_size else nn.Identity()
        )
        self.rope = RotaryEmbedding(cfg.head_dim, {"rope_theta": cfg.rope_theta})
        self._rope: dict[tuple[torch.device, torch.dtype], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    def _rope_tables(self, device: torch.device, dtype: torch.dtype) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, signed sin) per step, by its first position: a frame's positions are the same
        every frame (0-1, then one per fed-back group), so they are computed once, each by
        the same call the step would make."""
        tables = self._rope.get((device, dtype))
        if tables is None:
            tables = {}
            for start, n in [(0, 2), *((p, 1) for p in range(2, self.cfg.num_code_groups))]:
                cos, sin = self.rope(torch.arange(start, start + n, device=device), dtype)
                tables[start] = cos, signed_sin(sin)
            self._rope[(device, dtype)] = tables
        return tables

    def _layers(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[list[torch.Tensor] | None]
    ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        new = []
        for i, layer in enumerate(self.model.layers):
            x, cache = layer.forward_dense(x, cos, sin, caches[i])
            new.append(cache)
        return self.model.norm(x[:, -1]), new

    def _step(self, x: torch.Tensor, start: int, caches: list[list[torch.Tensor] | None]) -> torch.Tensor:
        cos, sin = self._rope_tables(x.device, x.dtype)[start]
        h, caches[:] = self._layers(x, cos, sin, caches)
        return h

    def forward(self, hidden: torch.Tensor, first_code_embed: torch.Tensor, sampler: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden`` [B, Ht] (the talker's normed last state), ``first_code_embed`` [B, Ht]
        → (residual codes [B, G-1], sum of their embeddings [B, Ht]).

        The loop length is static (G-1 draws), so the whole region can be captured (and
        compiled: ``Talker.compile_regions``).
        """
        caches: list[list[torch.Tensor] | None] = [None] * len(self.model.layers)
        x = self.small_to_mtp_projection(torch.stack([hidden, first_code_embed], dim=1))
        h = self._step(x, 0, caches)
        codes: list[torch.Tensor] = []
        embed_sum = torch.zeros_like(hidden)
        for g in range(self.cfg.num_code_groups - 1):
            code = sampler.sample_aux(AUX_LABEL, self.lm_head[g](h)).tokens
            embed = self.model.codec_embedding[g](code)
            codes.append(code)
            embed_sum = embed_sum + embed
            if g + 1 < self.cfg.num_code_groups - 1:  # the last code is not fed back
                h = self._step(self.small_to_mtp_projection(embed[:, None, :]), g + 2, caches)
        return torch.stack(codes, dim=1), embed_sum
