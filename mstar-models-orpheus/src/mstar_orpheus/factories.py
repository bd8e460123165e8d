"""Node factories: build each node from the config, loading the checkpoint when given
(random init without one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar_orpheus.config import SNAC_DIR


def build_lm(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    """``dtype``: core's choice (``--dtype``; default float32)."""
    import torch
    from mstar.weights import load_weights, materialize

    from mstar_orpheus.lm_node import OrpheusLM

    dtype = dtype or torch.float32
    if checkpoint_dir is None:
        lm = OrpheusLM(config)
        lm.init_random(float(config.get("initializer_range", 0.02)))
        return lm.to(device=device, dtype=dtype)
    with torch.device("meta"):  # no random init of weights about to be overwritten
        lm = OrpheusLM(config).to(dtype)
    lm = materialize(lm, device)  # on a tensor-parallel rank: its part only
    # Derived buffers some exports carry, and a tied head's duplicate, are not loaded.
    ignore = (r"rotary_emb\.inv_freq$", *((r"^lm_head\.weight$",) if lm.tied else ()))
    load_weights(lm, checkpoint_dir, ignore=ignore)
    return lm


def build_snac(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    """Always float32 (the plugin lists ``snac`` in ``float32_nodes``)."""
    import torch

    from mstar_orpheus.snac_model import load_snac_weights
    from mstar_orpheus.snac_node import SnacNode, codec_batch

    node = SnacNode(config["snac"], batch=codec_batch(config, device))
    if checkpoint_dir is not None:
        load_snac_weights(node.snac, Path(checkpoint_dir) / SNAC_DIR)
    return node.to(device=device, dtype=dtype or torch.float32)
