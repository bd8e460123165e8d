"""The vision encoder loaded from a real-layout tiny checkpoint equals transformers'
Qwen3OmniMoeVisionEncoder (merged tokens and every deepstack feature) on images, several images
and video grids batched together."""

from __future__ import annotations

import json

import pytest
import torch
from encoder_helpers import build_reference_towers, write_tower_checkpoint
from mstar.weights import load_weights
from mstar_qwen3omni.checkpoint_keys import VISION_TOWER_KEYS
from mstar_qwen3omni.vision_encoder import VisionEncoder, VisionEncoderConfig, vision_token_counts

TOL = 1e-4

# (t, h, w) in patches: images of different shapes (one larger than the 6x6 position table,
# one smaller), a 3-step video, and the smallest grid.
GRIDS = [[1, 4, 6], [1, 8, 10], [3, 4, 4], [1, 2, 2], [2, 6, 2]]


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    ref_audio, ref_vision = build_reference_towers(seed=7)
    root = write_tower_checkpoint(tmp_path_factory.mktemp("ckpt"), ref_audio, ref_vision)
    cfg = VisionEncoderConfig.from_dict(json.loads((root / "config.json").read_text())["thinker_config"]["vision_config"])
    ours = VisionEncoder(cfg).eval()
    load_weights(ours, root, **VISION_TOWER_KEYS)
    return ref_vision, ours


def _pixels(grids: list[list[int]], cfg: VisionEncoderConfig, seed: int) -> torch.Tensor:
    patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    total = sum(t * h * w for t, h, w in grids)
    return torch.randn(total, patch, generator=torch.Generator().manual_seed(seed))


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@torch.no_grad()
def test_batch_of_images_and_videos_equals_transformers(towers):
    ref, ours = towers
    pixels = _pixels(GRIDS, ours.cfg, seed=1)
    grid = torch.tensor(GRIDS)
    expected = ref(pixels, grid_thw=grid)
    got = ours(pixels, grid)
    assert got.embeds.shape == (int(vision_token_counts(grid, 2).sum()), 48)
    assert _max_err(got.embeds, expected.pooler_output) < TOL
    assert len(got.deepstack) == len(expected.deepstack_features) == 2
    for mine, theirs in zip(got.deepstack, expected.deepstack_features, strict=True):
        assert _max_err(mine, theirs) < TOL


@torch.no_grad()
def test_each_item_alone_equals_its_rows_in_the_batch(towers):
    """Batch invariance up to float rounding (padding changes the matmul shapes)."""
    _, ours = towers
    pixels = _pixels(GRIDS, ours.cfg, seed=2)
    grid = torch.tensor(GRIDS)
    batched = ours(pixels, grid)
    patches = grid.prod(-1).tolist()
    tokens = vision_token_counts(grid, 2).tolist()
    for i, (p_rows, t_rows) in enumerate(zip(pixels.split(patches), torch.tensor(tokens).cumsum(0).tolist(), strict=True)):
        alone = ours(p_rows, grid[i : i + 1])
        start = t_rows - tokens[i]
        assert _max_err(alone.embeds, batched.embeds[start:t_rows]) < TOL
        for a, b in zip(alone.deepstack, batched.deepstack, strict=True):
            assert _max_err(a, b[start:t_rows]) < TOL


@torch.no_grad()
def test_bfloat16_weights_stay_close_to_float32(towers):
    """A smoke check of mixed precision (the real checkpoint is bf16): same path, looser bound."""
    _, ours = towers
    pixels = _pixels(GRIDS[:2], ours.cfg, seed=3)
    grid = torch.tensor(GRIDS[:2])
    full = ours(pixels, grid).embeds
    half = VisionEncoder(ours.cfg)
    half.load_state_dict(ours.state_dict())
    got = half.to(torch.bfloat16)(pixels, grid).embeds.float()
    assert (got - full).abs().max().item() < 0.1 * full.abs().max().item()


def test_segment_attention_equals_a_block_diagonal_mask():
    """The grouped, padded attention equals one dense attention with a block-diagonal mask."""
    from mstar_qwen3omni.media_attention import SegmentPlan, segment_attention

    lengths = torch.tensor([64, 1, 7, 64, 3, 50, 2, 33, 64])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(int(lengths.sum()), 4, 8, generator=gen) for _ in range(3))
    plan = SegmentPlan.from_lengths(lengths)
    assert 1 < len(plan.groups) < len(lengths)  # grouped by length, not one group, not one per segment
    got = segment_attention(q, k, v, plan, scale=0.3)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    mask = owner[:, None] == owner[None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=0.3
    ).transpose(0, 1)
    assert (got - expected).abs().max().item() < 1e-5


@torch.no_grad()
def test_requests_are_split_back_per_request(towers):
    ref, ours = towers
    requests = [GRIDS[:2], GRIDS[2:3], GRIDS[3:]]
    inputs = [(_pixels(g, ours.cfg, seed=10 + i), torch.tensor(g)) for i, g in enumerate(requests)]
    got = ours.encode_requests(inputs)
    for (pixels, grid), out in zip(inputs, got, strict=True):
        expected = ref(pixels, grid_thw=grid)
        assert _max_err(out.embeds, expected.pooler_output) < TOL
        for mine, theirs in zip(out.deepstack, expected.deepstack_features, strict=True):
            assert _max_err(mine, theirs) < TOL
