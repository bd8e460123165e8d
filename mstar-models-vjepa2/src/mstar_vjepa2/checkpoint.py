"""Loading and writing V-JEPA 2 checkpoints in the ``transformers`` layout
(``config.json`` + ``model.safetensors`` or HF's shards, keys ``encoder.*`` and
``predictor.*``), loaded through core's ``load_weights``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from mstar.weights import SafetensorsSource, load_weights
from safetensors.torch import save_file
from torch import nn

from mstar_vjepa2.config import TINY_CONFIG, from_hf_dict

# A VJEPA2ForVideoClassification checkpoint holds VJEPA2Model's keys under this prefix,
# beside its pooler and classifier, which are not loaded.
_CLASSIFIER_PREFIX = "vjepa2."
_CLASSIFIER_HEADS = ("pooler.", "classifier.")
COMPONENTS = ("encoder.", "predictor.")


def load_component(module: nn.Module, checkpoint_dir: Path, component: str = "") -> None:
    """Fill ``module`` strictly from the checkpoint's ``component`` keys (``encoder.``,
    ``predictor.``, or ``""`` for the whole VJEPA2Model); any key that is neither the
    component's nor another component's is unexpected."""
    source = SafetensorsSource(checkpoint_dir)
    base = _CLASSIFIER_PREFIX if any(k.startswith(_CLASSIFIER_PREFIX) for k in source.weight_map) else ""
    others = tuple(base + c for c in COMPONENTS if component and c != component)
    skip = others + (_CLASSIFIER_HEADS if base else ())
    load_weights(module, source, prefix=base + component, skip=skip)


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
