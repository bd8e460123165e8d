"""The released 12 Hz codec decoder's sizes (``speech_tokenizer/config.json`` of the
Qwen3-TTS checkpoints) with random weights: for streaming tests and benchmarks, since
real weights cannot be downloaded here. Its exact left context is 580 frames (46.4 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch

from mstar_qwen3tts.codec_node import CodecNode
from mstar_qwen3tts.config import CODEC_MODEL_TYPE, CodecConfig

RELEASED_DECODER: dict[str, Any] = {
    "codebook_size": 2048, "codebook_dim": 512, "num_quantizers": 16, "latent_dim": 1024, "decoder_dim": 1536,
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
    "num_key_value_heads": 16, "head_dim": 64, "sliding_window": 72, "attention_bias": False, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 8000, "layer_scale_initial_scale": 0.01,
    "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
}


def released_codec_config(**decoder_overrides: Any) -> CodecConfig:
    """The released decoder config (``decoder_overrides`` replace keys, e.g. a narrower
    ``decoder_dim`` to keep a CPU test fast), read through the checkpoint parser."""
    decoder: Mapping[str, Any] = {**RELEASED_DECODER, **decoder_overrides}
    samples = 1
    for r in (*decoder["upsample_rates"], *decoder["upsampling_ratios"]):
        samples *= r
    config = {"model_type": CODEC_MODEL_TYPE, "output_sample_rate": 24000, "decode_upsample_rate": samples,
              "decoder_config": decoder}
    return CodecConfig.from_dict(config, "speech_tokenizer/config.json")


def random_codec(cfg: CodecConfig, seed: int = 0, stateful: bool = True) -> CodecNode:
    """A codec node with seeded random weights scaled as the tiny checkpoints' (audible,
    unclipped output)."""
    from mstar_qwen3tts.tiny_checkpoint import _normalize_output, _randomize

    node = CodecNode(cfg, stateful=stateful)
    weights = _randomize(node.state_dict(), torch.Generator().manual_seed(seed))
    _normalize_output(SimpleNamespace(codec=cfg), weights)
    node.load_state_dict(weights)
    return node.eval()
