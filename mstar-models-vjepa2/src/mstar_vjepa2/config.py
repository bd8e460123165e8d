"""V-JEPA 2 sizes, read from a checkpoint's ``config.json`` (the ``transformers`` layout)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURE = "VJEPA2Model"


@dataclass(frozen=True)
class VitConfig:
    """One ViT stack (encoder or predictor)."""

    hidden_size: int
    num_heads: int
    num_layers: int
    mlp_hidden: int
    eps: float = 1e-6
    qkv_bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VJEPA2Config:
    patch_size: int
    tubelet_size: int
    crop_size: int
    in_chans: int
    frames_per_clip: int
    encoder: VitConfig
    predictor: VitConfig
    num_mask_tokens: int

    @property
    def grid(self) -> int:
        return self.crop_size // self.patch_size

    @property
    def tokens_per_tubelet(self) -> int:
        return self.grid * self.grid

    def num_tokens(self, num_frames: int) -> int:
        return max(1, num_frames // self.tubelet_size) * self.tokens_per_tubelet


def from_hf_dict(cfg: dict[str, Any]) -> VJEPA2Config:
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"config.json hidden_act {act!r}: only 'gelu' is implemented")
    patch = cfg.get("patch_size", 16)
    if not isinstance(patch, int):
        patch = int(patch[0])
    eps = float(cfg.get("layer_norm_eps", 1e-6))
    hidden = int(cfg["hidden_size"])
    pred_hidden = int(cfg.get("pred_hidden_size", 384))
    return VJEPA2Config(
        patch_size=patch,
        tubelet_size=int(cfg.get("tubelet_size", 2)),
        crop_size=int(cfg.get("crop_size", 256)),
        in_chans=int(cfg.get("in_chans", 3)),
        frames_per_clip=int(cfg.get("frames_per_clip", 64)),
        encoder=VitConfig(hidden, int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"]),
                          int(hidden * float(cfg.get("mlp_ratio", 4.0))), eps, bool(cfg.get("qkv_bias", True))),
        predictor=VitConfig(pred_hidden, int(cfg.get("pred_num_attention_heads", 12)),
                            int(cfg.get("pred_num_hidden_layers", 12)),
                            int(pred_hidden * float(cfg.get("pred_mlp_ratio", 4.0))), eps, bool(cfg.get("qkv_bias", True))),
        num_mask_tokens=int(cfg.get("pred_num_mask_tokens", 10)),
    )


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The raw ``config.json`` (the engine passes it around as a plain dict)."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: a V-JEPA 2 checkpoint directory holds config.json + model.safetensors")
    cfg = json.loads(path.read_text())
    from_hf_dict(cfg)  # fail at load time on an unsupported config
    return cfg


TINY_CONFIG: dict[str, Any] = {
    "architectures": [ARCHITECTURE],
    "model_type": "vjepa2",
    "patch_size": 4,
    "crop_size": 16,
    "frames_per_clip": 8,
    "tubelet_size": 2,
    "hidden_size": 48,
    "in_chans": 3,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "mlp_ratio": 2.0,
    "layer_norm_eps": 1e-6,
    "qkv_bias": True,
    "hidden_act": "gelu",
    "pred_hidden_size": 36,
    "pred_num_attention_heads": 3,
    "pred_num_hidden_layers": 2,
    "pred_num_mask_tokens": 10,
    "pred_zero_init_mask_tokens": False,
    "pred_mlp_ratio": 2.0,
}
