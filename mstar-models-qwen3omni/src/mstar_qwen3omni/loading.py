"""Building the nodes' modules from a checkpoint directory (strict) or at random."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mstar.layers import CheckpointMismatchError, safetensors_keys

from mstar_qwen3omni.config import model_dtype
from mstar_qwen3omni.text_model import checkpoint_views
from mstar_qwen3omni.thinker_node import ThinkerNode
from mstar_qwen3omni.weights import load_component

# Top-level components of the released checkpoints; the Thinker reads ``thinker.*`` only.
KNOWN_PREFIXES = ("thinker.", "talker.", "code2wav.")
ENCODER_PREFIXES = ("audio_tower.", "visual.")  # under thinker.: the encoder nodes' weights


def check_components(checkpoint_dir: Path) -> None:
    """Every key belongs to a known component (a stray key is an error, not ignored)."""
    stray = sorted(k for k in safetensors_keys(checkpoint_dir) if not k.startswith(KNOWN_PREFIXES))
    if stray:
        raise CheckpointMismatchError(f"{checkpoint_dir}: unexpected keys outside {list(KNOWN_PREFIXES)}: {stray[:10]}")


def build_thinker(config: dict[str, Any], checkpoint_dir: Path | None, device: str) -> ThinkerNode:
    dtype = model_dtype(config, device)
    if checkpoint_dir is None:
        node = ThinkerNode(config, dtype)
        node.init_random(float(config["thinker_config"].get("initializer_range", 0.02)))
        return node.to(device=device, dtype=dtype)
    check_components(Path(checkpoint_dir))
    with torch.device("meta"):  # no random init of weights about to be overwritten
        node = ThinkerNode(config, dtype).to(dtype)
    node = node.to_empty(device=device)
    load_component(node.lm, Path(checkpoint_dir), "thinker.", expand=checkpoint_views, exclude=ENCODER_PREFIXES)
    return node
