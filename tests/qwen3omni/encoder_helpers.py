"""Tiny Qwen3-Omni audio/vision towers built with transformers' own classes, written in the real
checkpoint layout (``config.json`` with ``thinker_config.{audio,vision}_config``,
``model.safetensors`` with ``thinker.audio_tower.*`` / ``thinker.visual.*`` keys)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoderConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeVisionEncoder,
)

TINY_AUDIO = dict(
    num_mel_bins=32,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=64,
    d_model=32,
    output_dim=48,
    downsample_hidden_size=8,
    max_source_positions=100,
    n_window=50,  # transformers' token count hard-codes 13 tokens per full 100-frame chunk
    n_window_infer=200,
    conv_chunksize=3,
)

TINY_VISION = dict(
    depth=4,
    hidden_size=32,
    intermediate_size=64,
    num_heads=4,
    in_channels=3,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=48,
    num_position_embeddings=36,
    deepstack_visual_indexes=[0, 2],
    hidden_act="gelu_pytorch_tanh",
)


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Weights far from init (norm scales included) so a wrong formula cannot hide in tiny values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight") or ".ln_" in name or "norm1" in name or "norm2" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(noise * (0.3 if p.ndim > 1 else 0.1))


def build_reference_towers(seed: int = 0) -> tuple[Qwen3OmniMoeAudioEncoder, Qwen3OmniMoeVisionEncoder]:
    audio_cfg = Qwen3OmniMoeAudioEncoderConfig(**TINY_AUDIO)
    vision_cfg = Qwen3OmniMoeVisionEncoderConfig(**TINY_VISION)
    torch.manual_seed(seed)
    audio = Qwen3OmniMoeAudioEncoder(audio_cfg).eval()
    vision = Qwen3OmniMoeVisionEncoder(vision_cfg).eval()
    _randomise(audio, seed + 1)
    _randomise(vision, seed + 2)
    return audio, vision


def write_tower_checkpoint(
    root: Path, audio: Qwen3OmniMoeAudioEncoder, vision: Qwen3OmniMoeVisionEncoder
) -> Path:
    """config.json + model.safetensors holding both towers under their real key names."""
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"thinker.audio_tower.{k}": v.contiguous() for k, v in audio.state_dict().items()}
    tensors |= {f"thinker.visual.{k}": v.contiguous() for k, v in vision.state_dict().items()}
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe",
        "thinker_config": {
            "model_type": "qwen3_omni_moe_thinker",
            "audio_config": audio.config.to_dict(),
            "vision_config": vision.config.to_dict(),
        },
    }
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root
