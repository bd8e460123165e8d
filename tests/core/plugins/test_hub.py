"""Checkpoints by Hugging Face repo id (``mstar.hub``) and model resolution from a repo's
``config.json``, on a Hub cache written in the real layout and read offline."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants
from mstar.hub import HubError, checkpoint_dir, is_repo_id
from mstar.plugins.discovery import resolve_model
from mstar.plugins.errors import UnknownArchitectureError

_spec = importlib.util.spec_from_file_location("hub_cache", Path(__file__).resolve().parents[2] / "fixtures" / "hub_cache.py")
hub_cache = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hub_cache)

MAIN = "a" * 40
OLD = "b" * 40


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline Hub cache holding acme/toy at two commits (main and tag v0)."""
    from mstar_toy.checkpoint import write_checkpoint

    home = tmp_path / "hf"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache.hf_hub_cache(home)))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    ckpt = write_checkpoint(tmp_path / "toy")
    hub_cache.write_snapshot(home, "acme/toy", ckpt, MAIN)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"architectures": ["SomethingElse"]}))
    hub_cache.write_snapshot(home, "acme/toy", old, OLD, refs=("v0",))
    return home


def test_repo_ids_are_org_slash_name_and_not_existing_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_repo_id("Qwen/Qwen3-TTS-12Hz-0.6B") and is_repo_id("a_b/c.d-e")
    assert not is_repo_id("toy") and not is_repo_id("a/b/c") and not is_repo_id("/abs/path") and not is_repo_id("a/")
    monkeypatch.chdir(tmp_path)
    assert is_repo_id("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_repo_id("org/name")  # a relative directory wins over the Hub


def test_repo_id_resolves_to_the_cached_snapshot_offline(hf_home: Path, tmp_path: Path) -> None:
    path = checkpoint_dir("acme/toy")
    assert path == hub_cache.hf_hub_cache(hf_home) / "models--acme--toy" / "snapshots" / MAIN
    src = tmp_path / "toy"
    for file in src.rglob("*"):
        if file.is_file():
            assert (path / file.relative_to(src)).read_bytes() == file.read_bytes()
    assert (path / "model.safetensors").is_symlink()


def test_revision_by_tag_or_commit(hf_home: Path) -> None:
    assert checkpoint_dir("acme/toy", revision="v0").name == OLD
    assert checkpoint_dir("acme/toy", revision=MAIN).name == MAIN
    assert json.loads((checkpoint_dir("acme/toy", revision="v0") / "config.json").read_text())["architectures"] == ["SomethingElse"]


def test_uncached_repo_offline_is_one_line_naming_the_cache(hf_home: Path) -> None:
    with pytest.raises(HubError) as info:
        checkpoint_dir("acme/missing")
    message = str(info.value)
    assert "acme/missing" in message and "HF_HUB_OFFLINE" in message and str(hub_cache.hf_hub_cache(hf_home)) in message
    assert "\n" not in message
    with pytest.raises(HubError, match="revision 'nope'"):
        checkpoint_dir("acme/toy", revision="nope")


def test_directories_and_non_ids(tmp_path: Path, hf_home: Path) -> None:
    assert checkpoint_dir(tmp_path) == tmp_path
    with pytest.raises(HubError, match="applies to Hub repo ids"):
        checkpoint_dir(tmp_path, revision="main")
    with pytest.raises(HubError, match="no such directory, and not a Hugging Face repo id"):
        checkpoint_dir(tmp_path / "a" / "b" / "c")


def test_resolve_model_from_a_repo_config(hf_home: Path) -> None:
    assert resolve_model("acme/toy").name == "toy"
    with pytest.raises(UnknownArchitectureError, match="SomethingElse"):
        resolve_model("acme/toy", revision="v0")
    with pytest.raises(HubError, match="acme/missing"):
        resolve_model("acme/missing")


def test_resolving_a_name_imports_no_hub_client() -> None:
    code = (
        "import sys; from mstar.plugins.discovery import resolve_model; resolve_model('toy'); "
        "assert 'huggingface_hub' not in sys.modules and 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_engine_from_a_repo_id_equals_the_same_checkpoint_by_directory(hf_home: Path, tmp_path: Path) -> None:
    import torch
    from mstar import Engine

    prompt = {"prompt_ids": torch.tensor([1, 72, 105, 33])}
    greedy = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    outputs = []
    for model, weights in (("acme/toy", None), ("toy", "acme/toy"), ("toy", tmp_path / "toy")):
        engine = Engine.from_model(model, weights=weights, max_num_seqs=2)
        try:
            assert engine.model_name == "toy"
            (out,) = engine.run_batch([{"inputs": prompt, "sampling": greedy}])
            outputs.append(out.cat("token").tolist())
        finally:
            engine.close()
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == 6
    with pytest.raises(ValueError, match="give weights="):
        Engine.from_model("toy")
