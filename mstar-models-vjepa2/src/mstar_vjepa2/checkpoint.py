"""Loading and writing V-JEPA 2 checkpoints in the ``transformers`` layout
(``config.json`` + ``model.safetensors``, keys ``encoder.*`` and ``predictor.*``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from mstar_vjepa2.config import TINY_CONFIG, from_hf_dict

# Keys of a VJEPA2ForVideoClassification checkpoint carry this prefix; the pooler and
# classifier are not part of VJEPA2Model and are not loaded.
_CLASSIFIER_PREFIX = "vjepa2."


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Copy ``state`` into ``module``; any missing, unexpected or misshapen key is an error."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{what}: missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                         f"unexpected keys {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(f"{what}: {k} has shape {tuple(v.shape)}, the config needs {tuple(own[k].shape)}")
    module.load_state_dict(dict(state), strict=True)


def read_state(checkpoint_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` (e.g. ``encoder.``), prefix removed."""
    state = load_file(str(Path(checkpoint_dir) / "model.safetensors"))
    if any(k.startswith(_CLASSIFIER_PREFIX) for k in state):
        state = {k[len(_CLASSIFIER_PREFIX):]: v for k, v in state.items() if k.startswith(_CLASSIFIER_PREFIX)}
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def video_preprocessor_config(crop_size: int) -> dict:
    """What ``transformers`` writes for ``VJEPA2VideoProcessor``."""
    return {
        "video_processor_type": "VJEPA2VideoProcessor",
        "crop_size": {"height": crop_size, "width": crop_size},
        "do_center_crop": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": int(crop_size * 256 / 224)},
    }


def random_state(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Random weights with non-trivial norms and biases (a parity test must see them)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in module.state_dict().items():
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            out[name] = 0.05 * torch.randn(p.shape, generator=gen)
    return out


def write_checkpoint(path: Path, config: dict | None = None, seed: int = 0) -> None:
    """A random-weight checkpoint in the real layout (tiny by default)."""
    from mstar_vjepa2.vit import VJEPA2

    config = dict(config or TINY_CONFIG)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = from_hf_dict(config)
    model = VJEPA2(cfg)
    state = {k: v.contiguous() for k, v in random_state(model, seed).items()}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "video_preprocessor_config.json").write_text(json.dumps(video_preprocessor_config(cfg.crop_size), indent=2))
