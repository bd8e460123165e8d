"""Batched SNAC windows: windows of several requests share decoder calls of exactly
``mstar_codec_batch`` rows, and a seeded request's audio stays byte-identical whatever
shares its calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar_orpheus.checkpoint import write_checkpoint
from mstar_orpheus.config import SNAC_DIR, load_config
from mstar_orpheus.snac_model import load_snac_weights
from mstar_orpheus.snac_node import SnacNode, codec_batch

BATCH = 4


@pytest.fixture(scope="module")
def batched_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("orpheus-batched"), mstar_codec_batch=BATCH)


def _node(ckpt: Path, batch: int) -> SnacNode:
    node = SnacNode(load_config(ckpt)["snac"], batch=batch)
    load_snac_weights(node.snac, ckpt / SNAC_DIR)
    return node.eval()


def test_batch_comes_from_the_config_or_the_device(batched_ckpt) -> None:
    assert codec_batch(load_config(batched_ckpt), "cpu") == BATCH
    assert codec_batch({}, "cpu") == 1 and codec_batch({}, "cuda") == 8
    with pytest.raises(ValueError, match="mstar_codec_batch"):
        codec_batch({"mstar_codec_batch": 0}, "cpu")


def test_a_window_decodes_to_the_same_bytes_in_any_company(batched_ckpt) -> None:
    node = _node(batched_ckpt, BATCH)
    g = torch.Generator().manual_seed(0)
    size = node.snac_cfg.codebook_size
    mine = torch.randint(0, size, (28,), generator=g)
    runs, calls = [], []
    node.snac.register_forward_hook(lambda m, a, o: calls.append(o.shape[0]))
    with torch.inference_mode():
        for company in (0, 1, 3, 6):  # 6 others: two calls, mine in the second
            others = torch.randint(0, size, (company, 28), generator=g)
            windows = torch.cat([others[:company // 2], mine[None], others[company // 2 :]])
            audio, valid = node.decode_windows(windows)
            assert valid.all() and audio.shape[0] == company + 1
            runs.append(audio[company // 2])
        assert set(calls) == {BATCH}
        alone = _node(batched_ckpt, 1).decode_windows(mine[None])[0][0]
    for run in runs[1:]:
        assert run.numpy().tobytes() == runs[0].numpy().tobytes()
    torch.testing.assert_close(runs[0], alone, atol=1e-5, rtol=0)


def test_seeded_wav_is_byte_identical_under_load_with_batched_snac(engines, batched_ckpt, prompts, monkeypatch) -> None:
    engine = engines(batched_ckpt)
    node = engine.core.nodes["snac"].submodule
    assert node.batch == BATCH
    rows: list[int] = []
    decode_windows = node.decode_windows
    monkeypatch.setattr(node, "decode_windows", lambda w: (rows.append(w.shape[0]), decode_windows(w))[1])
    seeded = {"inputs": {"prompt_ids": prompts.encode("The same every time.", "jess")}, "sampling": {"seed": 1234, "max_tokens": 56}}
    alone = engine.run_batch([seeded])[0]
    assert alone.error is None and alone.cat("audio").numel() > 2 * 2048
    others = [{"inputs": {"prompt_ids": prompts.encode(f"Another request, number {i}.", v)}, "sampling": {"max_tokens": 30 + 3 * i}}
              for i, v in enumerate(["tara", "leah", "leo", "dan", "mia", "zac"])]
    crowded = engine.run_batch([*others[:3], seeded, *others[3:]])
    assert all(r.error is None for r in crowded)
    assert max(rows) > 1, "SNAC never decoded two requests' windows in one call"
    assert crowded[3].cat("audio").numpy().tobytes() == alone.cat("audio").numpy().tobytes()


def test_snac_runs_beside_the_lm_by_default_and_the_caller_can_turn_it_off(engines, ckpt) -> None:
    """The plugin's engine_defaults turn overlap_nodes on; an option given to the engine wins."""
    assert engines(ckpt).core.scheduler.config.overlap_nodes
    assert not engines(ckpt, overlap_nodes=False).core.scheduler.config.overlap_nodes


def test_seeded_wav_is_byte_identical_under_load_with_the_snac_beside_the_lm(engines, ckpt, prompts) -> None:
    """Default engine (SNAC on the overlap thread while the LM steps): a seeded request's audio
    alone equals its audio among six others, and SNAC batches did run beside LM batches."""
    engine = engines(ckpt)
    seeded = {"inputs": {"prompt_ids": prompts.encode("Beside the language model.", "leo")}, "sampling": {"seed": 4321, "max_tokens": 63}}
    alone = engine.run_batch([seeded])[0]
    assert alone.error is None and alone.cat("audio").numel() >= 3 * 2048
    others = [{"inputs": {"prompt_ids": prompts.encode(f"Company number {i}.", v)}, "sampling": {"seed": i, "max_tokens": 35 + 4 * i}}
              for i, v in enumerate(["tara", "leah", "jess", "dan", "mia", "zac"])]
    crowded = engine.run_batch([*others[:2], seeded, *others[2:]])
    assert all(r.error is None for r in crowded)
    assert engine.core.overlap.batches > 0  # the overlapped path ran
    assert crowded[2].cat("audio").numpy().tobytes() == alone.cat("audio").numpy().tobytes()
