"""Node factories: build each node from the config, loading the checkpoint when given
(random init without one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar_qwen3tts.config import Qwen3TTSConfig


def typed(config: dict[str, Any]) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(config)


def build_talker(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    """``dtype``: core's choice (``--dtype``; default float32)."""
    import torch
    from mstar.weights import load_weights

    from mstar_qwen3tts.checkpoint_keys import talker_keys
    from mstar_qwen3tts.talker import Talker

    cfg = typed(config)
    dtype = dtype or torch.float32
    talker = Talker(cfg, dtype)
    if checkpoint_dir is not None:
        load_weights(talker, checkpoint_dir, **talker_keys(base=cfg.tts_model_type == "base"))
    return talker.to(device=device, dtype=dtype)


def codec_batches(configured: int | None, device: str) -> tuple[int, int]:
    """(rows per codec call of continuing streams, rows per call of streams at their first
    chunk): the configured ``codec_batch`` for both, else by device. A padded row is nearly
    free on a GPU; on a CPU it costs compute, so first chunks decode alone (the time to first
    audio stays that of one request) and later chunks in calls of 4, which on the benchmark's
    CPU cost about as much per row as calls of 8 (benchmarks/codec_batching.py)."""
    import torch

    if configured is not None:
        return configured, configured
    return (8, 8) if torch.device(device).type == "cuda" else (4, 1)


def build_codec(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    """Float32 whatever ``--dtype`` says (``float32_nodes``): audio quality, and it is small."""
    from mstar.weights import load_weights

    from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS
    from mstar_qwen3tts.codec_node import CodecNode

    cfg = typed(config)
    batch, first_batch = codec_batches(cfg.streaming.codec_batch, device)
    node = CodecNode(
        cfg.codec, stateful=cfg.streaming.stateful, batch=batch, left_context=cfg.streaming.left_context, first_batch=first_batch,
    )
    if checkpoint_dir is not None:
        load_weights(node, Path(checkpoint_dir) / CODEC_DIR, **CODEC_KEYS)
    return node.to(device=device, dtype=dtype)
