"""The released V-JEPA 2 sizes (ViT-L/H/g at 256 px, ViT-g at 384 px): our modules have
exactly the parameter names and shapes of ``transformers``' VJEPA2Model for each config
(built on the meta device: no memory, no weights)."""

from __future__ import annotations

import pytest
import torch
from mstar_vjepa2.config import from_hf_dict
from mstar_vjepa2.vit import VJEPA2

transformers = pytest.importorskip("transformers")

SIZES = {  # the hub configs' sizes (facebook/vjepa2-vit{l,h,g}-fpc64-256, vitg-fpc64-384)
    "vitl-256": {},
    "vith-256": {"hidden_size": 1280, "num_attention_heads": 16, "num_hidden_layers": 32},
    "vitg-256": {"hidden_size": 1408, "num_attention_heads": 22, "num_hidden_layers": 40, "mlp_ratio": 48 / 11},
    "vitg-384": {"hidden_size": 1408, "num_attention_heads": 22, "num_hidden_layers": 40, "mlp_ratio": 48 / 11, "crop_size": 384},
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_parameter_names_and_shapes_match_transformers(name):
    cfg = transformers.VJEPA2Config(**SIZES[name])
    with torch.device("meta"):
        ref = transformers.VJEPA2Model(cfg)
        ours = VJEPA2(from_hf_dict(cfg.to_dict()))
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert got == want


def test_released_ac_layout_loads_through_the_renaming():
    """Upstream's released V-JEPA 2-AC widths (names and shapes recorded from upstream's
    modules by tools/make_fixtures.py, 2 blocks each): the config inferred from them builds
    an encoder and predictor whose keys and shapes are exactly the renamed upstream ones."""
    import json
    from pathlib import Path

    from mstar.weights import StateDictSource, check_weights
    from mstar_vjepa2.ac_predictor import ACPredictor
    from mstar_vjepa2.checkpoint_ac import (
        ENCODER_KEYS,
        PREDICTOR_KEYS,
        ac_config,
        config_from_states,
        encoder_config,
    )
    from mstar_vjepa2.vit import Encoder

    shapes = json.loads((Path(__file__).parent / "fixtures" / "ac_released_shapes.json").read_text())
    enc_sd = {k: torch.empty(s, device="meta") for k, s in shapes["encoder"].items()}
    pred_sd = {k: torch.empty(s, device="meta") for k, s in shapes["predictor"].items()}
    cfg = config_from_states(enc_sd, pred_sd, {})
    assert (cfg["embed_dim"], cfg["predictor_dim"], cfg["action_dim"], cfg["patch_size"]) == (1408, 1024, 7, 16)
    with torch.device("meta"):
        enc, pred = Encoder(encoder_config(cfg)), ACPredictor(ac_config(cfg))
    upstream = {f"encoder.{k}": v for k, v in enc_sd.items()} | {f"predictor.{k}": v for k, v in pred_sd.items()}
    check_weights(enc, StateDictSource(upstream, "released shapes"), **ENCODER_KEYS)
    check_weights(pred, StateDictSource(upstream, "released shapes"), **PREDICTOR_KEYS)
