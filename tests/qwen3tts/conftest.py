"""Tiny Qwen3-TTS checkpoints (real layout), shared engines and the qwen-tts fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mstar import Engine
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3tts-tiny"))


@pytest.fixture(scope="session")
def tiny_cfg(tiny_ckpt: Path) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(load_config(tiny_ckpt))


@pytest.fixture(scope="session")
def engines():
    """Engines by (checkpoint, options), shared by the tests of a session."""
    made: dict[tuple, Engine] = {}

    def get(ckpt: Path, **kw: Any) -> Engine:
        key = (str(ckpt), tuple(sorted(kw.items())))
        if key not in made:
            made[key] = Engine.from_model("qwen3tts", weights=ckpt, **kw)
        return made[key]

    yield get
    for e in made.values():
        e.close()


@pytest.fixture(scope="session")
def tiny_engine(engines, tiny_ckpt: Path) -> Engine:
    return engines(tiny_ckpt)


@pytest.fixture(scope="session")
def reference_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwen3tts-reference")
