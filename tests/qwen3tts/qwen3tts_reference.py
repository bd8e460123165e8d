"""The qwen-tts fixtures: reference outputs, and the tiny checkpoint they were made on,
rebuilt here from its seed and checked against the digest recorded with them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mstar_qwen3tts.tiny_checkpoint import tensors_digest, write_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"
REGENERATE = "bash mstar-models-qwen3tts/tools/make_fixtures.sh"


@dataclass
class Reference:
    """One fixture file: the reference outputs on a checkpoint rebuilt here."""

    variant: str
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    ckpt: Path

    def get(self, case: str, name: str) -> torch.Tensor:
        return self.tensors[f"{case}/{name}"]


_references: dict[str, Reference] = {}


def load_reference(variant: str, tmp_root: Path) -> Reference:
    if variant not in _references:
        path = FIXTURES / f"{variant}.safetensors"
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["meta"])
        ckpt = write_checkpoint(tmp_root / variant, preset=meta["preset"], seed=meta["seed"], overrides=meta["overrides"],
                                kind=meta.get("kind", "custom_voice"))
        for name, want in meta["digest"].items():
            got = tensors_digest(load_file(str(ckpt / name)))
            assert got == want, (
                f"the rebuilt tiny checkpoint's {name} differs from the one the fixtures were made on "
                f"(the writer or torch's RNG changed); regenerate them with `{REGENERATE}`"
            )
        _references[variant] = Reference(variant, meta, load_file(str(path)), ckpt)
    return _references[variant]
