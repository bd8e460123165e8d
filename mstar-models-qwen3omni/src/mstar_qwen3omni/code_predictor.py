"""The code predictor: a small dense transformer over one frame's residual codebook groups,
run inside every Talker step once the frame's first code (group 0) is sampled.

Per frame (transformers' ``Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration``
driven by the Talker's ``prepare_inputs_for_generation``): the input is [the Talker's final
normed hidden state, the Talker's codec embedding of code 0]; ``lm_head[0]`` on the last
position gives group 1's logits; then each sampled code g (1..G-2) is embedded with
``codec_embedding[g-1]``, fed back, and ``lm_head[g]`` gives group g+1. Positions restart at
0 every frame (a fresh cache per frame). Every residual code is drawn with the auxiliary
sampler label ``AUX_LABEL``, so a plugin declares that label and this loop as a piecewise
region (``uses_sampler``), as Qwen3-TTS does.

The frame's next Talker input is the sum of its code embeddings: Talker ``codec_embedding``
of code 0 plus ``codec_embedding[g-1]`` of code g for g = 1..G-1 (the last one too, though it
is never fed to the predictor).
"""

from __future__ import annotations

from typing import Any

import torch
from mstar.layers import DecoderLayer, RMSNorm, RotaryEmbedding
from torch import nn

from mstar_qwen3omni.dense_attention import DenseKVCache
from mstar_qwen3omni.talker_config import CodePredictorConfig

AUX_LABEL = "code_predictor"
# transformers' generate draws residual codes with top_k 50, top_p 0.8 when the Talker
# samples (temperature 1), and greedily when it does not.
AUX_SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_k": 50, "top_p": 0.8}


class CodePredictorModel(nn.Module):
    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg.layer, qk_norm=True) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, cfg.hidden_size) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Module names follow ``talker.code_predictor.*``."""

    def __init__(self, cfg: CodePredictorConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorModel(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope)

    def hidden(self, x: torch.Tensor, cache: DenseKVCache) -> torch.Tensor:
        """``x`` [B, n, H] the next n inputs of B frames -> normed hidden state [B, n, H]."""
        b, n, h = x.shape
        start = cache.length()
        positions = torch.arange(start, start + n, device=x.device).repeat(b)
        cos, sin = self.rope(positions, x.dtype)
        flat = x.reshape(b * n, h)
        for i, layer in enumerate(self.model.layers):
            flat = layer(flat, cos, sin, cache, i)
        return self.model.norm(flat).view(b, n, h)

    def forward(self, talker_hidden: torch.Tensor, first_embed: torch.Tensor, sampler: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``talker_hidden`` [B, H] (the Talker's normed last state), ``first_embed`` [B, H]
        (Talker codec embedding of code 0) -> (residual codes [B, G-1], the sum of their
        embeddings [B, H]). The loop has a static length (G-1 draws), so it can be captured."""
        cache = DenseKVCache(talker_hidden.shape[0])
        h = self.hidden(torch.stack([talker_hidden, first_embed], dim=1), cache)[:, -1]
        codes: list[torch.Tensor] = []
        embed_sum = torch.zeros_like(talker_hidden)
        groups = self.cfg.num_code_groups - 1
        for g in range(groups):
            code = sampler.sample_aux(AUX_LABEL, self.lm_head[g](h)).tokens
            embed = self.model.codec_embedding[g](code)
            codes.append(code)
            embed_sum = embed_sum + embed
            if g + 1 < groups:  # the last code is embedded for the sum but never fed back
                h = self.hidden(embed[:, None, :], cache)[:, -1]
        return torch.stack(codes, dim=1), embed_sum

    def teacher_forced_logits(self, talker_hidden: torch.Tensor, first_embed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Logits of every residual group [B, G-1, V] given the frame's codes ``residual``
        [B, G-1] (one forward over the frame: scoring, tests)."""
        fed = [self.model.codec_embedding[g](residual[:, g]) for g in range(self.cfg.num_code_groups - 2)]
        x = torch.stack([talker_hidden, first_embed, *fed], dim=1)
        h = self.hidden(x, DenseKVCache(x.shape[0]))[:, 1:]
        return torch.stack([self.lm_head[g](h[:, g]) for g in range(self.cfg.num_code_groups - 1)], dim=1)
