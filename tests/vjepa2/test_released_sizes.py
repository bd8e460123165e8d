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
