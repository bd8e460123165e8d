"""Node factories: build each node from the config, loading the checkpoint when given
(random init without one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar_qwen3tts.config import Qwen3TTSConfig


def typed(config: dict[str, Any]) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(config)


def build_talker(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    import torch

    from mstar_qwen3tts.talker import Talker
    from mstar_qwen3tts.weights import load_talker

    cfg = typed(config)
    # Checkpoints are bf16; CPU runs float32 (bf16 matmuls there are slow and imprecise).
    dtype = getattr(torch, cfg.torch_dtype) if torch.device(device).type == "cuda" else torch.float32
    talker = Talker(cfg, dtype)
    if checkpoint_dir is not None:
        load_talker(talker, checkpoint_dir, base=cfg.tts_model_type == "base")
    return talker.to(device=device, dtype=dtype)


def build_codec(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Any:
    import torch

    from mstar_qwen3tts.codec_node import CodecNode
    from mstar_qwen3tts.weights import load_codec

    cfg = typed(config)
    batch = cfg.streaming.codec_batch
    if batch is None:  # a padded batch is nearly free on a GPU, not on a CPU
        batch = 8 if torch.device(device).type == "cuda" else 1
    node = CodecNode(cfg.codec, stateful=cfg.streaming.stateful, batch=batch, left_context=cfg.streaming.left_context)
    if checkpoint_dir is not None:
        load_codec(node, checkpoint_dir)
    return node.to(device)
