"""A tiny Qwen3-Omni checkpoint (real layout, written with transformers' classes) and engines
shared by the tests of a session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def omni_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("qwen3omni-tiny"))


@pytest.fixture(scope="session")
def omni_engines():
    """Engines by (checkpoint, options), shared by the tests of a session."""
    from mstar import Engine

    made: dict[tuple, Any] = {}

    def get(ckpt: Path, **kw: Any) -> Engine:
        key = (str(ckpt), tuple(sorted(kw.items())))
        if key not in made:
            made[key] = Engine.from_model("qwen3omni", weights=ckpt, **kw)
        return made[key]

    yield get
    for e in made.values():
        e.close()
