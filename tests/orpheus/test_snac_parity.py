"""The SNAC decoder against ``snac.SNAC`` on the same checkpoint files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mstar_orpheus.checkpoint import SNAC_24KHZ
from mstar_orpheus.config import SNAC_DIR
from mstar_orpheus.snac_model import SnacConfig, SnacDecoder, load_snac_weights
from snac import SNAC

TOL = 1e-5


def _ours(snac_dir: Path) -> SnacDecoder:
    dec = SnacDecoder(SnacConfig.from_dict(json.loads((snac_dir / "config.json").read_text()))).eval()
    load_snac_weights(dec, snac_dir)
    return dec


def _codes(batch: int, frames: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (batch, frames * n), generator=g) for n in (1, 2, 4)]


def _max_diff(ours: SnacDecoder, ref: SNAC, codes: list[torch.Tensor], seeded_noise: bool) -> float:
    with torch.inference_mode():
        torch.manual_seed(7)
        expected = ref.decode(codes)
        torch.manual_seed(7)  # our noise blocks draw the same numbers in the same order
        noise = (lambda block, b, t: torch.randn((b, 1, t))) if seeded_noise else None
        got = ours(codes, noise)
    assert got.shape == expected.shape
    return float((got - expected).abs().max())


def test_tiny_snac_matches_without_noise(quiet_ckpt):
    snac_dir = quiet_ckpt / SNAC_DIR
    diff = _max_diff(_ours(snac_dir), SNAC.from_pretrained(str(snac_dir)), _codes(3, 4), seeded_noise=False)
    print(f"max |audio - snac| (noise off): {diff:.2e}")
    assert diff < TOL


def test_tiny_snac_matches_with_identically_seeded_noise(ckpt):
    snac_dir = ckpt / SNAC_DIR
    ref = SNAC.from_pretrained(str(snac_dir))
    assert any("NoiseBlock" in type(m).__name__ for m in ref.modules())
    diff = _max_diff(_ours(snac_dir), ref, _codes(2, 6, seed=1), seeded_noise=True)
    assert diff < TOL


@pytest.fixture(scope="module")
def released_size_snac(tmp_path_factory) -> Path:
    """A random SNAC of the released 24 kHz sizes, saved by ``snac`` itself."""
    d = tmp_path_factory.mktemp("snac24")
    torch.manual_seed(3)
    torch.save(SNAC(**SNAC_24KHZ).state_dict(), d / "pytorch_model.bin")
    (d / "config.json").write_text(json.dumps(SNAC_24KHZ))
    return d


def test_released_size_snac_saved_by_snac_loads_and_matches(released_size_snac):
    ref = SNAC.from_pretrained(str(released_size_snac))
    diff = _max_diff(_ours(released_size_snac), ref, _codes(1, 4, seed=2), seeded_noise=True)
    print(f"max |audio - snac| (released sizes, seeded noise): {diff:.2e}")
    assert diff < TOL


def test_legacy_weight_norm_names_load_identically(quiet_ckpt, tmp_path):
    src = quiet_ckpt / SNAC_DIR
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    legacy = {k.replace(".parametrizations.weight.original0", ".weight_g").replace(".parametrizations.weight.original1", ".weight_v"): v
              for k, v in state.items()}
    assert any(k.endswith(".weight_g") for k in legacy)
    torch.save(legacy, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    codes = _codes(1, 4)
    with torch.inference_mode():
        torch.testing.assert_close(_ours(tmp_path)(codes), _ours(src)(codes), rtol=0, atol=0)


def test_plugin_tiny_checkpoint_is_a_strict_snac_checkpoint(ckpt):
    ref = SNAC.from_config(str(ckpt / SNAC_DIR / "config.json"))
    ref.load_state_dict(torch.load(ckpt / SNAC_DIR / "pytorch_model.bin", weights_only=True), strict=True)
