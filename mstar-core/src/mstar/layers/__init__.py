"""Model-agnostic building blocks that model plugins share (no model names here).

Module and parameter names follow HF's Llama-family code, so checkpoint keys load as
they are with ``load_safetensors``.
"""

from mstar.layers.attention import PagedSelfAttention, head_dim_of
from mstar.layers.decoder import DecoderLayer
from mstar.layers.mlp import GatedMLP
from mstar.layers.norm import RMSNorm
from mstar.layers.rope import RotaryEmbedding, apply_rope, rope_parameters
from mstar.layers.vocab_head import vocab_logits
from mstar.layers.weights import CheckpointMismatchError, load_safetensors, safetensors_keys

__all__ = [
    "CheckpointMismatchError",
    "DecoderLayer",
    "GatedMLP",
    "PagedSelfAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "head_dim_of",
    "load_safetensors",
    "rope_parameters",
    "safetensors_keys",
    "vocab_logits",
]
