"""The Thinker LLM (Qwen3-MoE with QK-norm and M-RoPE) on M*'s paged KV cache. Module
names follow the checkpoint (``thinker.model.*``, ``thinker.lm_head``)."""

from __future__ import annotations

from typing import Any

import torch
from mstar.layers import GatedMLP, PagedSelfAttention, RMSNorm, vocab_logits
from torch import nn

from mstar_qwen3omni.config import TextConfig
from mstar_qwen3omni.moe import SparseMoeBlock
from mstar_qwen3omni.mrope import MRotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, index: int) -> None:
        super().__init__()
        self.self_attn = PagedSelfAttention(
            cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias, qk_norm_eps=cfg.rms_norm_eps
        )
        self.mlp: nn.Module
        if cfg.is_sparse(index):
            self.mlp = SparseMoeBlock(
                cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
            )
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Any, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class ThinkerTextModel(nn.Module):
    """Embeddings, decoder layers and the final norm (checkpoint prefix ``thinker.model.``)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = MRotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        attention: Any,
        deepstack: list[torch.Tensor] | None = None,
        deepstack_rows: torch.Tensor | None = None,
        keep: list[torch.Tensor] | None = None,
        keep_layer: int = 0,
    ) -> torch.Tensor:
        """[T, H] input embeddings of all rows (flat), [3, T] M-RoPE positions -> [T, H]
        hidden states before the final norm. ``deepstack[i]`` [n, H] is added to the rows ``deepstack_rows``
        after layer i (the vision tower's multi-level features). With ``keep`` (a list), the
        state after ``keep_layer`` layers (0: the inputs), before any deepstack addition, is
        appended to it (the Talker reads one layer's states)."""
        cos, sin = self.rope(positions, embeds.dtype)
        x = embeds
        if keep is not None and keep_layer == 0:
            keep.append(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attention, i)
            if keep is not None and keep_layer == i + 1:
                keep.append(x)
            if deepstack is not None and i < len(deepstack):
                x = x.index_add(0, deepstack_rows, deepstack[i].to(x.dtype))
        return x


class ThinkerLM(nn.Module):
    """``model`` + ``lm_head``: the Thinker's language model as stored under ``thinker.``."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = ThinkerTextModel(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head (only over the rows that sample)."""
        h = self.model.norm(hidden)
        return vocab_logits(h, self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight)
