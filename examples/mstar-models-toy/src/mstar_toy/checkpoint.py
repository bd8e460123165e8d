"""Writing and reading the toy checkpoint: config.json + model.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from mstar.weights import load_weights
from safetensors.torch import save_file
from torch import nn

from mstar_toy.config import DEFAULT_CONFIG

WEIGHTS = "model.safetensors"


def write_checkpoint(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random-weight checkpoint in the real layout; ``overrides`` change config keys."""
    from mstar_toy.decoder import ToyDecoder
    from mstar_toy.lm import ToyLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {**json.loads(json.dumps(DEFAULT_CONFIG)), **overrides}
    torch.manual_seed(seed)
    lm, decoder = ToyLM(config), ToyDecoder(config)
    with torch.no_grad():  # spread the logits so greedy decoding is not a tie-fest
        lm.head.weight.mul_(4.0)
        lm.aux_head.weight.mul_(4.0)
        # Keep EOS rare so tiny random models produce output of useful length.
        lm.head.weight[config["eos_token_id"]].mul_(0.0)
    tensors = {f"lm.{k}": v.contiguous() for k, v in lm.state_dict().items()}
    tensors |= {f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()}
    save_file(tensors, str(path / WEIGHTS))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def build_lm(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Node ``lm``'s factory: random init without a checkpoint; ``dtype`` is core's choice
    (``--dtype``)."""
    from mstar_toy.lm import ToyLM

    lm = ToyLM(config).to(dtype)
    if checkpoint_dir is not None:
        # Strict (one error lists missing, unexpected and mis-shaped keys); cast to the
        # parameters' dtype as it loads.
        load_weights(lm, checkpoint_dir, prefix="lm.")
    return lm.to(device)


def build_decoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Node ``decoder``'s factory (float32: the plugin lists it in ``float32_nodes``)."""
    from mstar_toy.decoder import ToyDecoder

    dec = ToyDecoder(config).to(dtype)
    if checkpoint_dir is not None:
        load_weights(dec, checkpoint_dir, prefix="decoder.")
    return dec.to(device)
