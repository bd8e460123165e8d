"""Writing and reading the toy checkpoint: config.json + model.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
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


def load_weights(module: nn.Module, checkpoint_dir: Path, prefix: str) -> None:
    """Strict: missing or unexpected keys raise one error listing them."""
    state = {k[len(prefix) :]: v for k, v in load_file(str(Path(checkpoint_dir) / WEIGHTS)).items() if k.startswith(prefix)}
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{checkpoint_dir}/{WEIGHTS} ({prefix}*): missing keys {missing}, unexpected keys {unexpected}")
    module.load_state_dict(state)
