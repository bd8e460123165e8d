"""Model-agnostic building blocks that model plugins share (no model names here).

Module and parameter names follow HF's Llama-family code, so checkpoint keys load as
they are with ``mstar.weights.load_weights``.
"""

from mstar.layers.attention import PagedSelfAttention, head_dim_of
from mstar.layers.decoder import DecoderLayer
from mstar.layers.mlp import GatedMLP
from mstar.layers.norm import RMSNorm
from mstar.layers.rope import RotaryEmbedding, apply_rope, rope_parameters
from mstar.layers.vocab_head import vocab_logits

__all__ = [
    "DecoderLayer",
    "GatedMLP",
    "PagedSelfAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "head_dim_of",
    "rope_parameters",
    "vocab_logits",
]
