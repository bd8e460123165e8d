"""Cross-attention of a decoder's tokens over the request's encoder states, through the
engine's cross-attention cache (``KVCacheLayout.cross_attention``; ``mstar.attention.cross``).

Module names are those of Whisper, BART and Marian checkpoints (``q_proj``, ``k_proj``,
``v_proj``, ``out_proj``); another layout loads through ``mstar.weights.load_weights``'s
renames.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.model.submodule_base import ModelInputsFromEngine


class CrossAttention(nn.Module):
    """``forward(x [T, hidden], engine_inputs, layer) -> [T, hidden]``.

    K and V are projected only from ``engine_inputs.cross_states`` (the rows that write their
    cross cache this step, once per request); every other step attends to the cached ones.
    Softmax scale ``head_dim ** -0.5``. ``kv_hidden``: the encoder states' width when it
    differs from ``hidden``.
    """

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_hidden: int | None = None,
        q_bias: bool = True,
        k_bias: bool = False,
        v_bias: bool = True,
        out_bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = head_dim or hidden // num_heads
        kv_hidden = kv_hidden or hidden
        self.q_proj = nn.Linear(hidden, num_heads * self.head_dim, bias=q_bias)
        self.k_proj = nn.Linear(kv_hidden, self.num_kv_heads * self.head_dim, bias=k_bias)
        self.v_proj = nn.Linear(kv_hidden, self.num_kv_heads * self.head_dim, bias=v_bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, hidden, bias=out_bias)

    def forward(self, x: torch.Tensor, engine_inputs: ModelInputsFromEngine, layer: int) -> torch.Tensor:
        attention = engine_inputs.attention
        assert attention is not None, "cross-attention runs on a KV node"
        q = self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim)
        states = engine_inputs.cross_states
        k = v = None
        if states is not None:
            k = self.k_proj(states).view(-1, self.num_kv_heads, self.head_dim)
            v = self.v_proj(states).view(-1, self.num_kv_heads, self.head_dim)
        out = attention.cross(layer, q, k, v)
        return self.out_proj(out.reshape(x.shape[0], -1))
