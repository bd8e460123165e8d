"""M-RoPE prompt positions and decode deltas against transformers' ``get_rope_index``."""

from __future__ import annotations

import pytest
import torch
from mstar_qwen3omni.config import MultimodalTokens, load_config
from mstar_qwen3omni.positions import audio_token_count, prompt_positions
from thinker_reference import (
    AUDIO,
    AUDIO_END,
    AUDIO_START,
    IMAGE,
    VIDEO,
    VISION_END,
    VISION_START,
    _interleave,
    audio_tokens,
    hf_thinker,
)


def _hf(model, ids, use_audio_in_video=False, **kw):
    ids = torch.tensor([ids])
    pos, delta = model.model.get_rope_index(ids, attention_mask=torch.ones_like(ids), use_audio_in_video=use_audio_in_video, **kw)
    return pos[:, 0], float(delta.reshape(-1)[0])


def test_audio_token_count_matches_transformers():
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        _get_feat_extract_output_lengths,
    )

    lengths = torch.arange(1, 1000)
    assert torch.equal(audio_token_count(lengths, 50), _get_feat_extract_output_lengths(lengths, 50))


def test_text_image_audio_video_prompt(omni_ckpt):
    """Images of different grids, an audio and a video (fractional seconds per grid) in one
    prompt: every position and the delta equal transformers'."""
    model = hf_thinker(str(omni_ckpt))
    tokens = MultimodalTokens.from_config(load_config(omni_ckpt))
    images = torch.tensor([[1, 4, 6], [1, 8, 4]])
    videos = torch.tensor([[3, 4, 4]])
    frames = torch.tensor([230])
    ids = [5, 6, VISION_START, *[IMAGE] * 6, VISION_END, 7, AUDIO_START, *[AUDIO] * audio_tokens(230), AUDIO_END,
           VISION_START, *[VIDEO] * 12, VISION_END, 8, 9, VISION_START, *[IMAGE] * 8, VISION_END, 10]
    ours, delta = prompt_positions(torch.tensor(ids), tokens, images, videos, torch.tensor([0.7]), frames)
    ref, ref_delta = _hf(model, ids, image_grid_thw=images, video_grid_thw=videos, second_per_grids=torch.tensor([0.7]),
                         audio_seqlens=frames)
    torch.testing.assert_close(ours, ref.float(), rtol=0, atol=0)
    assert delta == pytest.approx(ref_delta, abs=1e-5) and delta != 0


# A one-grid video whose width positions pass its audio's end: the reference continues after
# the last audio position (its last piece), not after the largest position of the block.
@pytest.mark.parametrize(("grid_t", "frames"), [(4, 17), (4, 60), (4, 260), (4, 465), (1, 17)])
def test_video_with_its_audio(omni_ckpt, grid_t, frames):
    model = hf_thinker(str(omni_ckpt))
    tokens = MultimodalTokens.from_config(load_config(omni_ckpt))
    videos = torch.tensor([[grid_t, 4, 8]])
    body = _interleave(grid_t, 8, 1.5 * 13, audio_tokens(frames))
    ids = [1, 2, VISION_START, AUDIO_START, *body, AUDIO_END, VISION_END, 3]
    ours, delta = prompt_positions(torch.tensor(ids), tokens, None, videos, torch.tensor([1.5]), torch.tensor([frames]))
    ref, ref_delta = _hf(model, ids, use_audio_in_video=True, video_grid_thw=videos, second_per_grids=torch.tensor([1.5]),
                         audio_seqlens=torch.tensor([frames]))
    torch.testing.assert_close(ours, ref.float(), rtol=0, atol=0)
    assert delta == pytest.approx(ref_delta, abs=1e-5)


def test_placeholder_count_mismatch_is_an_input_error(omni_ckpt):
    tokens = MultimodalTokens.from_config(load_config(omni_ckpt))
    ids = torch.tensor([VISION_START, *[IMAGE] * 3, VISION_END])
    with pytest.raises(ValueError, match="image placeholder block"):
        prompt_positions(ids, tokens, torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="more image placeholders"):
        prompt_positions(ids, tokens, None)
