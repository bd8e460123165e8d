"""Model-agnostic building blocks that model plugins share (no model names here).

Module and parameter names follow HF's Llama-family code, so checkpoint keys load as
they are with ``mstar.weights.load_weights``.
"""

from mstar.layers.attention import (
    PagedSelfAttention,
    full_attention_limit,
    head_dim_of,
    sliding_window_of,
)
from mstar.layers.decoder import DecoderLayer, DecoderModel
from mstar.layers.mlp import GatedMLP
from mstar.layers.norm import RMSNorm
from mstar.layers.rope import RotaryEmbedding, apply_rope, rope_parameters, rotate, signed_sin
from mstar.layers.vocab_head import vocab_logits


def load_safetensors(module: object, checkpoint_dir: object, prefix: str = "", ignore: object = ()) -> None:
    """Deprecated since plugin API 1.1: ``mstar.weights.load_weights``."""
    from mstar.plugins.deprecations import deprecated
    from mstar.weights import load_weights

    deprecated("mstar.layers", "load_safetensors").use(stacklevel=2)
    load_weights(module, checkpoint_dir, prefix=prefix, ignore=ignore)  # type: ignore[arg-type]


def safetensors_keys(checkpoint_dir: object) -> dict[str, str]:
    """Deprecated since plugin API 1.1: ``mstar.weights.SafetensorsSource(dir).weight_map``."""
    from mstar.plugins.deprecations import deprecated
    from mstar.weights import SafetensorsSource

    deprecated("mstar.layers", "safetensors_keys").use(stacklevel=2)
    return dict(SafetensorsSource(checkpoint_dir).weight_map)  # type: ignore[arg-type]


def __getattr__(name: str) -> object:
    if name == "CheckpointMismatchError":  # moved to mstar.weights; the same class
        from mstar.weights import CheckpointMismatchError

        return CheckpointMismatchError
    raise AttributeError(f"module 'mstar.layers' has no attribute {name!r}")


__all__ = [
    "DecoderLayer",
    "DecoderModel",
    "GatedMLP",
    "PagedSelfAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "full_attention_limit",
    "head_dim_of",
    "rope_parameters",
    "rotate",
    "signed_sin",
    "sliding_window_of",
    "vocab_logits",
]
