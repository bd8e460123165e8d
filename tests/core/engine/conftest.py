"""Fixtures for engine tests: tiny toy checkpoints on disk and a dense reference decoder."""

from __future__ import annotations

from pathlib import Path

import pytest
from mstar import Engine
from mstar_toy.checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def toy_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("toy"))


@pytest.fixture
def make_engine(toy_ckpt: Path):
    engines: list[Engine] = []

    def make(ckpt: Path | None = None, **kw) -> Engine:
        e = Engine.from_model("toy", weights=ckpt or toy_ckpt, **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()
