"""Tiny Orpheus checkpoints in the released layouts, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from mstar import Engine
from mstar_orpheus.checkpoint import write_checkpoint
from mstar_orpheus.config import load_config
from mstar_orpheus.prompt import SpeechPrompt


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's own tiny checkpoint: audio-steered LM, SNAC with noise blocks."""
    return write_checkpoint(tmp_path_factory.mktemp("orpheus"))


@pytest.fixture(scope="session")
def quiet_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sharded LM weights and a noise-free SNAC, so audio is comparable with ``snac``."""
    return write_checkpoint(tmp_path_factory.mktemp("orpheus-quiet"), seed=1, shards=2, snac={"noise": False})


@pytest.fixture(scope="session")
def tied_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("orpheus-tied"), seed=2, steer_audio=False, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def prompts(quiet_ckpt: Path) -> SpeechPrompt:
    return SpeechPrompt.from_config(load_config(quiet_ckpt), quiet_ckpt)


@pytest.fixture(scope="session")
def engines():
    """Engines by (checkpoint, options), shared by the tests of a session."""
    made: dict[tuple, Engine] = {}

    def get(ckpt: Path, **kw) -> Engine:
        key = (str(ckpt), tuple(sorted(kw.items())))
        if key not in made:
            made[key] = Engine.from_model("orpheus", weights=ckpt, **kw)
        return made[key]

    yield get
    for e in made.values():
        e.close()
