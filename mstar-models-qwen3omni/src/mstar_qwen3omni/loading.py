"""Building the nodes' modules from a checkpoint directory (strict, through core's
``load_weights``) or at random."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mstar.weights import load_weights, materialize

from mstar_qwen3omni.checkpoint_keys import THINKER_KEYS
from mstar_qwen3omni.thinker_node import ThinkerNode


def build_thinker(config: dict[str, Any], checkpoint_dir: Path | None, device: str,
                  dtype: torch.dtype = torch.float32) -> ThinkerNode:
    """``dtype``: core's choice (``--dtype``)."""
    if checkpoint_dir is None:
        node = ThinkerNode(config, dtype)
        node.init_random(float(config["thinker_config"].get("initializer_range", 0.02)))
        return node.to(device=device, dtype=dtype)
    with torch.device("meta"):  # no random init of weights about to be overwritten
        node = ThinkerNode(config, dtype).to(dtype)
    node = materialize(node, device)  # on a tensor-parallel rank: its part only
    load_weights(node.lm, checkpoint_dir, **THINKER_KEYS)
    return node
