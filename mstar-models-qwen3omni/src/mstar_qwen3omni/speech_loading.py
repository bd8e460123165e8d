"""Building the speech nodes' modules from a checkpoint directory (strict, through core's
``load_weights``: every ``talker.*`` or ``code2wav.*`` key fills a parameter and every
parameter is filled) or at random."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mstar.weights import CheckpointMismatchError, SafetensorsSource, load_weights, materialize

from mstar_qwen3omni.checkpoint_keys import CODE2WAV_KEYS, TALKER_KEYS
from mstar_qwen3omni.code2wav import Code2Wav
from mstar_qwen3omni.code2wav_config import Code2WavConfig
from mstar_qwen3omni.code2wav_node import Code2WavNode
from mstar_qwen3omni.talker import TalkerNode


def build_talker(config: dict[str, Any], checkpoint_dir: Path | None, device: str, prefill_walks: tuple[str, ...] = ("prefill",),
                 dtype: torch.dtype = torch.float32) -> TalkerNode:
    if checkpoint_dir is None:
        node = TalkerNode(config, dtype, prefill_walks)
        node.init_random(float(config["talker_config"].get("initializer_range", 0.02)))
        return node.to(device=device, dtype=dtype)
    with torch.device("meta"):  # no random init of weights about to be overwritten
        node = TalkerNode(config, dtype, prefill_walks).to(dtype)
    node = materialize(node, device)  # on a tensor-parallel rank: its part only
    load_weights(node.lm, checkpoint_dir, **TALKER_KEYS)
    node.tts_embeds.copy_(thinker_embedding_rows(Path(checkpoint_dir), [node.cfg.tts_bos_id, node.cfg.tts_eos_id, node.cfg.tts_pad_id]))
    return node


def thinker_embedding_rows(checkpoint_dir: Path, ids: list[int]) -> torch.Tensor:
    """Rows ``ids`` of the Thinker's input embedding table, read without loading the table
    (the Talker needs three of them and may run where the Thinker does not)."""
    key = "thinker.model.embed_tokens.weight"
    source = SafetensorsSource(checkpoint_dir)
    if key not in source:
        raise CheckpointMismatchError(f"{checkpoint_dir}: no {key} (the Talker reads the tts_* rows of it)")
    try:
        return torch.stack([source.read(key, (slice(i, i + 1),))[0] for i in ids]).to(torch.float32)
    finally:
        source.close()


def build_code2wav(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> Code2Wav:
    """Code2Wav in float32 whatever the checkpoint's dtype (audio quality; it is small)."""
    cfg = Code2WavConfig.from_config(config)
    if checkpoint_dir is None:
        return Code2Wav(cfg).to(device)
    with torch.device("meta"):
        module = Code2Wav(cfg)
    module = module.to_empty(device=device)
    load_weights(module, checkpoint_dir, **CODE2WAV_KEYS)
    return module.eval()


def build_code2wav_node(config: dict[str, Any], checkpoint_dir: Path | None, device: str, batch: int = 1,
                        dtype: torch.dtype = torch.float32) -> Code2WavNode:
    """The ``code2wav`` node with its weights, float32 (the plugin lists it in
    ``float32_nodes``: audio quality; it is small); ``batch``: rows per decoder call."""
    if checkpoint_dir is None:
        return Code2WavNode(config, batch).to(device=device, dtype=dtype)
    with torch.device("meta"):
        node = Code2WavNode(config, batch).to(dtype)
    node = node.to_empty(device=device)
    load_weights(node.code2wav, checkpoint_dir, **CODE2WAV_KEYS)
    return node.eval()
