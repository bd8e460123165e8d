"""The Qwen3-Omni Talker's network, everything under the checkpoint's ``talker.`` prefix: the
MoE decoder (``TalkerModel``), the two projections from the Thinker's width
(``text_projection``, ``hidden_projection``), the codec head and the code predictor
(``TalkerLM``). The node ``talker`` (``mstar_qwen3omni.talker``) runs it on M*'s paged KV
cache; ``talker_prompt`` builds its prefill with the projections.
"""

from __future__ import annotations

from typing import Any

import torch
from mstar.layers import PagedSelfAttention, RMSNorm
from mstar.layers.mlp import ACTIVATIONS
from torch import nn

from mstar_qwen3omni.code_predictor import CodePredictor
from mstar_qwen3omni.mrope import MRotaryEmbedding
from mstar_qwen3omni.talker_config import TalkerConfig
from mstar_qwen3omni.talker_moe import SharedExpertMoeBlock

# Outputs of ``TalkerLM.sample_frame`` (and signals of the node): a frame's codes [1, G] and
# the sum of its code embeddings [1, H].
CODES, FRAME_EMBED = "codes", "frame_embed"


class ResizeMLP(nn.Module):
    """Thinker width -> Talker width (``linear_fc2(act(linear_fc1(x)))``, with biases)."""

    def __init__(self, cin: int, inner: int, cout: int, act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cin, inner, bias=True)
        self.linear_fc2 = nn.Linear(inner, cout, bias=True)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class TalkerLayer(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.self_attn = PagedSelfAttention(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias, qk_norm_eps=cfg.rms_norm_eps
        )
        self.mlp = SharedExpertMoeBlock(
            cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
            cfg.norm_topk_prob, cfg.shared_expert_intermediate_size,
        )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class TalkerModel(nn.Module):
    """Decoder layers, final norm and the codec embedding (checkpoint prefix ``talker.model.``)."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TalkerLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rope = MRotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        """[T, H] inputs of all rows (flat), [3, T] positions -> [T, H] normed hidden states."""
        cos, sin = self.rope(positions, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attention, i)
        return self.norm(x)


class TalkerLM(nn.Module):
    """Everything under ``talker.``: the decoder, the two projections from the Thinker, the
    codec head and the code predictor."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = ResizeMLP(cfg.thinker_hidden_size, cfg.intermediate_size, cfg.hidden_size, cfg.hidden_act)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden_size, cfg.intermediate_size, cfg.hidden_size, cfg.hidden_act)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.predictor)
        # A plain attribute, not a buffer: it never meets a meta-device construction.
        with torch.device("cpu"):
            self.suppress_mask = torch.zeros(cfg.vocab_size, dtype=torch.bool)
            self.suppress_mask[cfg.suppressed_ids()] = True

    def hidden_states(self, embeds: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        return self.model(embeds, positions, attention)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Code-0 logits with the never-sampled ids at -inf."""
        if self.suppress_mask.device != hidden.device:
            self.suppress_mask = self.suppress_mask.to(hidden.device)
        return self.codec_head(hidden).masked_fill(self.suppress_mask, float("-inf"))

    def sample_frame(self, static_inputs: dict[str, torch.Tensor], sampler: Any) -> dict[str, torch.Tensor]:
        """The piecewise region: code 0 (main sampler), the code predictor's depth loop
        (aux label), and the frame's summed code embeddings."""
        first = sampler.sample(static_inputs["logits"]).tokens
        first_embed = self.model.codec_embedding(first)
        residual, residual_embed = self.code_predictor(static_inputs["hidden"], first_embed, sampler)
        return {CODES: torch.cat([first[:, None], residual], dim=1), FRAME_EMBED: first_embed + residual_embed}
