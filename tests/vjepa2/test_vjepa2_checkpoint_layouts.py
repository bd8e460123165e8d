"""V-JEPA 2 checkpoints load through core's loader in every layout a release uses: HF's
shards give the engine the outputs the single file gives, a VJEPA2ForVideoClassification
file loads its VJEPA2Model keys, and a stray or missing key is one error naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.testing.sharding import shard_checkpoint
from mstar.weights import CheckpointMismatchError
from mstar_vjepa2.checkpoint import load_component, write_checkpoint
from mstar_vjepa2.config import TINY_CONFIG, from_hf_dict
from mstar_vjepa2.vit import VJEPA2
from safetensors.torch import load_file, save_file

CROP = TINY_CONFIG["crop_size"]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vjepa2_single")
    write_checkpoint(path, seed=3)
    return path


def _copy(src: Path, dst: Path, edit=None) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        tensors = load_file(str(dst / "model.safetensors"))
        save_file(edit(tensors), str(dst / "model.safetensors"))
    return dst


def _outputs(ckpt: Path) -> dict[str, torch.Tensor]:
    clip = torch.randn(4, 3, CROP, CROP, generator=torch.Generator().manual_seed(1))
    request = {"inputs": {"video": clip, "target_mask": torch.tensor([0, 5, 17]), "context_mask": torch.tensor([1, 2, 3, 20])},
               "kwargs": {"task": "predict"}}
    with Engine.from_model("vjepa2", weights=ckpt) as engine:
        (out,) = engine.run_batch([request])
    assert out.error is None, out.error
    return {k: v[0] for k, v in out.signals.items()}


def test_sharded_checkpoint_serves_the_single_files_outputs(single: Path, tmp_path: Path) -> None:
    sharded = _copy(single, tmp_path / "sharded")
    shard_checkpoint(sharded, 3)
    assert not (sharded / "model.safetensors").exists()
    want, got = _outputs(single), _outputs(sharded)
    assert want.keys() == got.keys() == {"latents", "predictions"}
    assert all(torch.equal(want[k], got[k]) for k in want)


def _model(ckpt: Path) -> VJEPA2:
    from mstar_vjepa2.config import load_config

    return VJEPA2(from_hf_dict(load_config(ckpt)))


def test_a_video_classification_checkpoint_loads_its_model_keys(single: Path, tmp_path: Path) -> None:
    heads = {"pooler.query_tokens": torch.zeros(1, 1, 8), "classifier.weight": torch.zeros(3, 8)}
    wrapped = _copy(single, tmp_path / "classifier", lambda t: {f"vjepa2.{k}": v for k, v in t.items()} | heads)
    a, b = _model(single), _model(single)
    load_component(a, single)
    load_component(b, wrapped)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t | {"extra.weight": torch.zeros(1)}, r"unexpected keys \(1\): \['extra.weight'\]"),
    (lambda t: {k: v for k, v in t.items() if k != "encoder.layernorm.bias"}, r"missing keys \(1\): \['encoder.layernorm.bias'\]"),
], ids=["stray", "missing"])
def test_a_stray_or_missing_key_is_one_error(single: Path, tmp_path: Path, edit, message: str) -> None:
    bad = _copy(single, tmp_path / "bad", edit)
    with pytest.raises(CheckpointMismatchError, match=message):
        load_component(_model(bad).encoder, bad, "encoder.")
