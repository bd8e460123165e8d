"""Loading V-JEPA 2-AC from upstream's checkpoint file.

Layout of a ``vjepa2ac`` checkpoint directory:

- ``vjepa2-ac-vitg.pt`` (any single ``*.pt`` is accepted): a ``torch.save`` dict with
  ``encoder`` and ``predictor`` state dicts under upstream's key names, possibly prefixed
  by ``module.`` / ``backbone.`` (stripped on load, as upstream's hub loader does);
- ``config.json`` (optional): what shapes cannot tell — ``img_size``, ``encoder_num_heads``,
  ``predictor_num_heads``, ``use_extrinsics``. Missing values default to the released
  ViT-g model's (256 px, 22 and 16 heads, no extrinsics).

Widths, depths, patch and tubelet sizes and the action width are read from the tensors.
Core's ``load_weights`` reads the file memory-mapped: encoder keys are renamed onto the
``transformers``-named encoder (``blocks.i.attn.qkv`` is split into ``query``/``key``/
``value``); predictor keys keep upstream's names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from mstar.weights import Packed, StateDictSource, load_weights, torch_file
from torch import nn

from mstar_vjepa2.ac_predictor import ACConfig
from mstar_vjepa2.config import VitConfig, VJEPA2Config

RELEASED_DEFAULTS = {"img_size": 256, "encoder_num_heads": 22, "predictor_num_heads": 16, "use_extrinsics": False}


def checkpoint_file(checkpoint_dir: Path) -> Path:
    files = sorted(Path(checkpoint_dir).glob("*.pt"))
    if len(files) != 1:
        raise FileNotFoundError(f"{checkpoint_dir}: expected one upstream checkpoint file (vjepa2-ac-vitg.pt), found {[f.name for f in files]}")
    return files[0]


# Upstream's hub loader strips these wrappers (DDP's ``module.``, ``backbone.``) from keys.
_WRAPPERS = (r"^(module\.)?(backbone\.)?", "")

# Upstream ViT names -> the transformers-named encoder's (``attn.qkv`` is split by ``QKV``).
ENCODER_RENAMES = (
    _WRAPPERS,
    (r"^patch_embed\.", "embeddings.patch_embeddings."),
    (r"^norm\.", "layernorm."),
    (r"^blocks\.(\d+)\.attn\.", r"layer.\1.attention."),
    (r"^blocks\.(\d+)\.", r"layer.\1."),
)
QKV = Packed("qkv", ("query", "key", "value"))


def _upstream(checkpoint_dir: Path) -> StateDictSource:
    """The checkpoint file's tensors, memory-mapped, keyed ``encoder.*`` / ``predictor.*``
    as upstream saved them."""
    return torch_file(checkpoint_file(checkpoint_dir))


# ``load_weights`` arguments of each component (``pos_embed``: a RoPE encoder has none).
ENCODER_KEYS: dict[str, Any] = dict(prefix="encoder.", renames=ENCODER_RENAMES, packed=(QKV,), ignore=(r"(^|\.)pos_embed$",))
PREDICTOR_KEYS: dict[str, Any] = dict(prefix="predictor.", renames=(_WRAPPERS,))


def load_encoder(module: nn.Module, checkpoint_dir: Path) -> None:
    load_weights(module, _upstream(checkpoint_dir), **ENCODER_KEYS)


def load_predictor(module: nn.Module, checkpoint_dir: Path) -> None:
    load_weights(module, _upstream(checkpoint_dir), **PREDICTOR_KEYS)


def read_upstream(checkpoint_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(encoder, predictor) tensors under upstream's names, wrappers stripped,
    memory-mapped (for reading the config from their shapes)."""
    state = _upstream(checkpoint_dir).state
    parts = []
    for part in ("encoder.", "predictor."):
        tensors = {re.sub(*_WRAPPERS, k[len(part):]): v for k, v in state.items() if k.startswith(part)}
        if not tensors:
            raise ValueError(f"{checkpoint_dir}: the checkpoint has no {part.rstrip('.')} state dict; keys: {sorted(state)[:8]}")
        parts.append(tensors)
    return parts[0], parts[1]


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


def encoder_state_to_upstream(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our encoder's keys in upstream's layout (``ENCODER_RENAMES`` and ``QKV`` undo it), for
    writing tiny checkpoints."""
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
