"""Strict loading of the Thinker's weights, config reading, and no Qwen3-Omni code in core."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from mstar.weights import CheckpointMismatchError, SafetensorsSource
from mstar_qwen3omni.config import TextConfig, load_config
from mstar_qwen3omni.loading import build_thinker

CORE = Path(__file__).resolve().parents[2] / "mstar-core"


def _indexed_copy(src: Path, dst: Path, edit) -> Path:
    """``dst``: src's config and weights file, with a weight map edited by ``edit``."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    (dst / "weights.safetensors").symlink_to(src / "model.safetensors")
    weight_map = dict.fromkeys(SafetensorsSource(src).weight_map, "weights.safetensors")
    edit(weight_map)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return dst


def test_sharded_index_loads_like_the_single_file(omni_ckpt, tmp_path):
    import torch

    ckpt = _indexed_copy(omni_ckpt, tmp_path / "indexed", lambda m: None)
    a = build_thinker(load_config(omni_ckpt), omni_ckpt, "cpu").state_dict()
    b = build_thinker(load_config(ckpt), ckpt, "cpu").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("thinker.model.layers.1.mlp.experts.5.up_proj.weight"), r"missing keys \(1\): \['thinker\.model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight'\]"),
        (lambda m: m.__setitem__("thinker.model.layers.0.mlp.shared_expert.weight", "weights.safetensors"), r"unexpected keys \(1\): \['thinker\.model\.layers\.0\.mlp\.shared_expert\.weight'\]"),
        (lambda m: m.__setitem__("vision_tower.x", "weights.safetensors"), r"unexpected keys \(1\): \['vision_tower\.x'\]"),
    ],
    ids=["missing-expert", "unexpected-key", "stray-component"],
)
def test_mismatched_checkpoint_is_one_clear_error(omni_ckpt, tmp_path, edit, message):
    ckpt = _indexed_copy(omni_ckpt, tmp_path / "bad", edit)
    with pytest.raises(CheckpointMismatchError, match=message):
        build_thinker(load_config(ckpt), ckpt, "cpu")


def test_sizes_come_from_the_config(omni_ckpt):
    cfg = json.loads((omni_ckpt / "config.json").read_text())
    text = TextConfig.from_config(cfg)
    t = cfg["thinker_config"]["text_config"]
    assert (text.num_layers, text.hidden_size, text.num_experts, text.num_experts_per_tok) == (
        t["num_hidden_layers"], t["hidden_size"], t["num_experts"], t["num_experts_per_tok"])
    assert [text.is_sparse(i) for i in range(text.num_layers)] == [True, True, False, True]
    cfg["thinker_config"]["text_config"]["rope_parameters"]["mrope_section"] = [8, 8, 8]
    with pytest.raises(ValueError, match="does not cover head_dim"):
        TextConfig.from_config(cfg)


def test_core_names_no_qwen3_omni():
    """Core's sources, metadata and docs never name the model: it lives in its plugin alone."""
    pattern = re.compile(r"qwen3 ?omni|qwen3_omni|qwen3-omni", re.IGNORECASE)
    files = [*(CORE / "src").rglob("*.py"), CORE / "pyproject.toml", CORE / "README.md"]
    hits = [f"{p.relative_to(CORE)}:{i}" for p in files if p.is_file()
            for i, line in enumerate(p.read_text(errors="ignore").splitlines(), 1) if pattern.search(line)]
    assert len(files) > 50 and not hits, hits
