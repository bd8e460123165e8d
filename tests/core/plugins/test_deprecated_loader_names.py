"""``mstar.layers.load_safetensors`` / ``safetensors_keys`` (the guide taught them in plugin
API 1.0) keep working through 1.1 with a deprecation warning, and load what the one loader
loads."""

from __future__ import annotations

import pytest
import torch
from mstar.plugins.deprecations import PluginApiDeprecationWarning
from mstar.weights import CheckpointMismatchError, load_weights


def test_the_old_loader_names_warn_and_load_like_load_weights(tmp_path):
    import mstar.layers as layers
    from mstar_toy.checkpoint import write_checkpoint
    from mstar_toy.config import load_config
    from mstar_toy.lm import ToyLM

    ckpt = write_checkpoint(tmp_path)
    old, new = ToyLM(load_config(ckpt)), ToyLM(load_config(ckpt))
    with pytest.warns(PluginApiDeprecationWarning, match=r"mstar\.layers\.load_safetensors\(\).*mstar\.weights\.load_weights"):
        layers.load_safetensors(old, ckpt, "lm.")
    load_weights(new, ckpt, prefix="lm.")
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values(), strict=True))
    with pytest.warns(PluginApiDeprecationWarning, match="safetensors_keys"):
        keys = layers.safetensors_keys(ckpt)
    assert set(keys.values()) == {"model.safetensors"} and any(k.startswith("lm.") for k in keys)
    assert layers.CheckpointMismatchError is CheckpointMismatchError
    with pytest.warns(PluginApiDeprecationWarning), pytest.raises(CheckpointMismatchError):
        layers.load_safetensors(ToyLM(load_config(ckpt)), ckpt, "decoder.")
