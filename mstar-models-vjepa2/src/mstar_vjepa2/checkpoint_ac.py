"""Loading V-JEPA 2-AC from upstream's checkpoint file.

Layout of a ``vjepa2ac`` checkpoint directory:

- ``vjepa2-ac-vitg.pt`` (any single ``*.pt`` is accepted): a ``torch.save`` dict with
  ``encoder`` and ``predictor`` state dicts under upstream's key names, possibly prefixed
  by ``module.`` / ``backbone.`` (stripped on load, as upstream's hub loader does);
- ``config.json`` (optional): what shapes cannot tell — ``img_size``, ``encoder_num_heads``,
  ``predictor_num_heads``, ``use_extrinsics``. Missing values default to the released
  ViT-g model's (256 px, 22 and 16 heads, no extrinsics).

Widths, depths, patch and tubelet sizes and the action width are read from the tensors.
Encoder keys are renamed onto the ``transformers``-named encoder (``blocks.i.attn.qkv`` is
split into ``query``/``key``/``value``); predictor keys keep upstream's names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from mstar_vjepa2.ac_predictor import ACConfig
from mstar_vjepa2.config import VitConfig, VJEPA2Config

RELEASED_DEFAULTS = {"img_size": 256, "encoder_num_heads": 22, "predictor_num_heads": 16, "use_extrinsics": False}


def checkpoint_file(checkpoint_dir: Path) -> Path:
    files = sorted(Path(checkpoint_dir).glob("*.pt"))
    if len(files) != 1:
        raise FileNotFoundError(f"{checkpoint_dir}: expected one upstream checkpoint file (vjepa2-ac-vitg.pt), found {[f.name for f in files]}")
    return files[0]


def _clean(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.replace("module.", "").replace("backbone.", ""): v for k, v in state.items()}


def read_upstream(checkpoint_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    raw = torch.load(checkpoint_file(checkpoint_dir), map_location="cpu", weights_only=True)
    missing = [k for k in ("encoder", "predictor") if k not in raw]
    if missing:
        raise ValueError(f"{checkpoint_dir}: the checkpoint has no {missing} state dict(s); keys: {sorted(raw)[:8]}")
    return _clean(raw["encoder"]), _clean(raw["predictor"])


def _count(state: dict[str, torch.Tensor], pattern: str) -> int:
    return len({m.group(1) for k in state if (m := re.match(pattern, k))})


def infer_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The plain-dict config the engine carries: shapes from the tensors, the rest from
    config.json or the released defaults."""
    enc, pred = read_upstream(checkpoint_dir)
    extra_path = Path(checkpoint_dir) / "config.json"
    extra = json.loads(extra_path.read_text()) if extra_path.is_file() else {}
    return config_from_states(enc, pred, extra)


def config_from_states(enc: dict[str, torch.Tensor], pred: dict[str, torch.Tensor], extra: dict[str, Any]) -> dict[str, Any]:
    cfg = {**RELEASED_DEFAULTS, **{k: extra[k] for k in RELEASED_DEFAULTS if k in extra}}
    pw = enc["patch_embed.proj.weight"]
    cfg.update(
        patch_size=int(pw.shape[-1]), tubelet_size=int(pw.shape[2]), in_chans=int(pw.shape[1]),
        embed_dim=int(pw.shape[0]), encoder_depth=_count(enc, r"blocks\.(\d+)\."),
        encoder_mlp_hidden=int(enc["blocks.0.mlp.fc1.weight"].shape[0]),
        predictor_dim=int(pred["predictor_embed.weight"].shape[0]),
        predictor_depth=_count(pred, r"predictor_blocks\.(\d+)\."),
        predictor_mlp_hidden=int(pred["predictor_blocks.0.mlp.fc1.weight"].shape[0]),
        action_dim=int(pred["action_encoder.weight"].shape[1]),
    )
    if any(k.endswith("mlp.fc3.weight") for k in pred):
        raise ValueError("this AC predictor uses SwiGLU MLPs; only the released GELU predictor is implemented")
    return cfg


def encoder_config(cfg: dict[str, Any]) -> VJEPA2Config:
    vit = VitConfig(cfg["embed_dim"], cfg["encoder_num_heads"], cfg["encoder_depth"], cfg["encoder_mlp_hidden"])
    return VJEPA2Config(patch_size=cfg["patch_size"], tubelet_size=cfg["tubelet_size"], crop_size=cfg["img_size"],
                        in_chans=cfg["in_chans"], frames_per_clip=cfg["tubelet_size"], encoder=vit, predictor=vit,
                        num_mask_tokens=1)


def ac_config(cfg: dict[str, Any]) -> ACConfig:
    grid = cfg["img_size"] // cfg["patch_size"]
    return ACConfig(embed_dim=cfg["embed_dim"], dim=cfg["predictor_dim"], depth=cfg["predictor_depth"],
                    num_heads=cfg["predictor_num_heads"], mlp_hidden=cfg["predictor_mlp_hidden"],
                    action_dim=cfg["action_dim"], grid_h=grid, grid_w=grid, use_extrinsics=cfg["use_extrinsics"])


def encoder_state(upstream: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Upstream ViT keys → our (``transformers``-named) encoder keys."""
    out: dict[str, torch.Tensor] = {}
    for key, value in upstream.items():
        if key == "pos_embed":
            continue  # a RoPE encoder does not use it
        if key.startswith("patch_embed."):
            out["embeddings.patch_embeddings." + key[len("patch_embed."):]] = value
        elif key.startswith("norm."):
            out["layernorm." + key[len("norm."):]] = value
        elif m := re.match(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", key):
            for name, part in zip(("query", "key", "value"), value.chunk(3, dim=0), strict=True):
                out[f"layer.{m.group(1)}.attention.{name}.{m.group(2)}"] = part.clone()
        elif m := re.match(r"blocks\.(\d+)\.attn\.proj\.(.*)$", key):
            out[f"layer.{m.group(1)}.attention.proj.{m.group(2)}"] = value
        elif m := re.match(r"blocks\.(\d+)\.(.*)$", key):
            out[f"layer.{m.group(1)}.{m.group(2)}"] = value
        else:
            out[key] = value  # reported as unexpected by the strict load
    return out


def encoder_state_to_upstream(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``encoder_state`` (for writing tiny checkpoints in upstream's layout)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in ours.items():
        if key.startswith("embeddings.patch_embeddings."):
            out["patch_embed." + key[len("embeddings.patch_embeddings."):]] = value
        elif key.startswith("layernorm."):
            out["norm." + key[len("layernorm."):]] = value
        elif m := re.match(r"layer\.(\d+)\.attention\.(query|key|value)\.(weight|bias)$", key):
            if m.group(2) == "query":
                parts = [ours[f"layer.{m.group(1)}.attention.{n}.{m.group(3)}"] for n in ("query", "key", "value")]
                out[f"blocks.{m.group(1)}.attn.qkv.{m.group(3)}"] = torch.cat(parts)
        elif m := re.match(r"layer\.(\d+)\.attention\.proj\.(.*)$", key):
            out[f"blocks.{m.group(1)}.attn.proj.{m.group(2)}"] = value
        elif m := re.match(r"layer\.(\d+)\.(.*)$", key):
            out[f"blocks.{m.group(1)}.{m.group(2)}"] = value
    return out


TINY_AC: dict[str, Any] = {
    "model_type": "vjepa2-ac", "img_size": 16, "patch_size": 4, "tubelet_size": 2, "in_chans": 3,
    "embed_dim": 48, "encoder_depth": 2, "encoder_num_heads": 4, "encoder_mlp_hidden": 96,
    "predictor_dim": 48, "predictor_depth": 2, "predictor_num_heads": 4, "predictor_mlp_hidden": 96,
    "action_dim": 7, "use_extrinsics": False,
}


def write_checkpoint(path: Path, seed: int = 0, config: dict[str, Any] | None = None) -> None:
    """A random checkpoint in upstream's layout (``vjepa2-ac-vitg.pt`` + config.json);
    ``config`` has ``TINY_AC``'s keys (default: tiny)."""
    config = config or TINY_AC
    from mstar_vjepa2.ac_predictor import ACPredictor
    from mstar_vjepa2.checkpoint import random_state
    from mstar_vjepa2.vit import Encoder

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    enc = random_state(Encoder(encoder_config(config)), seed)
    pred = random_state(ACPredictor(ac_config(config)), seed + 1)
    torch.save({"encoder": {f"module.backbone.{k}": v for k, v in encoder_state_to_upstream(enc).items()},
                "predictor": {f"module.{k}": v for k, v in pred.items()}}, path / "vjepa2-ac-vitg.pt")
    extra = {k: config[k] for k in ("model_type", "img_size", "encoder_num_heads", "predictor_num_heads", "use_extrinsics")}
    (path / "config.json").write_text(json.dumps(extra, indent=2))
