"""The fixture encoder–decoder plugin (tests/fixtures/plugins/whisper), installed as a real
distribution into its own folder, its tiny checkpoint written by transformers, and the
transformers model that checkpoint is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

MODEL = "tinywhisper"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "whisper"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]


@pytest.fixture(scope="session")
def whisper_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whisper-site")
    src = root / "src"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))

    def pip(*args: object) -> None:
        proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheels", src)
    pip("install", "--no-deps", "--no-index", "--target", root / "site", *(root / "wheels").glob("*.whl"))
    return root / "site"


@pytest.fixture(scope="session")
def whisper_plugin(whisper_site: Path):
    sys.path.insert(0, str(whisper_site))
    try:
        from mstar.plugins.loading import load_model

        yield load_model(MODEL)
    finally:
        sys.path.remove(str(whisper_site))


@pytest.fixture(scope="session")
def whisper_ckpt(whisper_plugin, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-whisper")
    whisper_plugin.spec.write_tiny_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def whisper_hf(whisper_ckpt: Path):
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(whisper_ckpt, output_loading_info=True)
    assert not any(info.values()), info
    return model.eval()
