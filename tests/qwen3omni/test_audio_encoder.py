"""The audio encoder loaded from a real-layout tiny checkpoint equals transformers'
Qwen3OmniMoeAudioEncoder on the same weights, batched over audios of ragged lengths."""

from __future__ import annotations

import json

import pytest
import torch
from encoder_helpers import build_reference_towers, write_tower_checkpoint
from mstar.weights import load_weights
from mstar_qwen3omni.audio_encoder import AudioEncoder, AudioEncoderConfig, audio_output_lengths
from mstar_qwen3omni.checkpoint_keys import AUDIO_TOWER_KEYS
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    _get_feat_extract_output_lengths as hf_output_lengths,
)

TOL = 1e-4


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    ref_audio, ref_vision = build_reference_towers(seed=3)
    root = write_tower_checkpoint(tmp_path_factory.mktemp("ckpt"), ref_audio, ref_vision)
    cfg = AudioEncoderConfig.from_dict(json.loads((root / "config.json").read_text())["thinker_config"]["audio_config"])
    ours = AudioEncoder(cfg).eval()
    load_weights(ours, root, **AUDIO_TOWER_KEYS)
    return ref_audio, ours


def _mels(lengths: list[int], mel_bins: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(mel_bins, n, generator=gen) for n in lengths]


@torch.no_grad()
def _reference(ref, mels: list[torch.Tensor]) -> torch.Tensor:
    lens = torch.tensor([m.shape[1] for m in mels])
    return ref(torch.cat(mels, dim=1), feature_lens=lens).last_hidden_state


def test_token_counts_match_the_processor():
    lens = torch.tensor([1, 37, 99, 100, 101, 250, 930, 1600])
    assert torch.equal(audio_output_lengths(lens, 50), hf_output_lengths(lens, 50))


@torch.no_grad()
def test_batch_of_long_audios_equals_transformers_batch(towers):
    """Every audio spans at least one full chunk, so transformers pads all chunks to the same width
    in one call; several attention windows per audio (n_window_infer=200 -> 26 tokens)."""
    ref, ours = towers
    mels = _mels([250, 930, 100, 401], ours.cfg.num_mel_bins, seed=1)
    expected = _reference(ref, mels)
    got = torch.cat(ours.encode(mels))
    assert got.shape == expected.shape == (int(hf_output_lengths(torch.tensor([250, 930, 100, 401])).sum()), 48)
    assert (got - expected).abs().max().item() < TOL


@torch.no_grad()
def test_each_audio_equals_transformers_alone_in_a_ragged_batch(towers):
    """Short audios (one partial chunk) batched with long ones still equal their own transformers call."""
    ref, ours = towers
    mels = _mels([37, 930, 5, 250, 99], ours.cfg.num_mel_bins, seed=2)
    got = ours.encode(mels)
    for mel, out in zip(mels, got, strict=True):
        expected = _reference(ref, [mel])
        assert out.shape == expected.shape
        assert (out - expected).abs().max().item() < TOL


@torch.no_grad()
def test_pad_groups_reproduce_one_transformers_call_per_request(towers):
    """Two requests: (short + long audio) and (short audio). Grouped, each request's outputs equal
    transformers encoding that request's audios in one call."""
    ref, ours = towers
    req_a = _mels([37, 250], ours.cfg.num_mel_bins, seed=4)
    req_b = _mels([61], ours.cfg.num_mel_bins, seed=5)
    got = ours.encode(req_a + req_b, pad_groups=[0, 0, 1])
    expected_a = _reference(ref, req_a)
    expected_b = _reference(ref, req_b)
    assert (torch.cat(got[:2]) - expected_a).abs().max().item() < TOL
    assert (got[2] - expected_b).abs().max().item() < TOL
    # The grouping matters: the short audio alone differs from the short audio padded with a long one.
    alone = _reference(ref, req_a[:1])
    assert (alone - expected_a[: alone.shape[0]]).abs().max().item() > 1e-3


def test_missing_key_is_one_error_naming_it(towers, tmp_path):
    ref, ours = towers
    from safetensors.torch import save_file

    state = {f"thinker.audio_tower.{k}": v for k, v in ref.state_dict().items() if k != "ln_post.bias"}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="ln_post.bias"):
        load_weights(AudioEncoder(ours.cfg), tmp_path, **AUDIO_TOWER_KEYS)


@torch.no_grad()
def test_requests_in_processor_layout_equal_one_transformers_call_each(towers):
    """encode_requests takes the processor's padded (audios, mel, frames) + mask per request."""
    ref, ours = towers

    def processor_layout(mels):
        frames = max(m.shape[1] for m in mels)
        feats = torch.zeros(len(mels), mels[0].shape[0], frames)
        mask = torch.zeros(len(mels), frames, dtype=torch.long)
        for i, m in enumerate(mels):
            feats[i, :, : m.shape[1]] = m
            mask[i, : m.shape[1]] = 1
        return feats, mask

    requests = [_mels([37, 250], 32, seed=6), _mels([930], 32, seed=7), _mels([12, 80, 5], 32, seed=8)]
    got = ours.encode_requests([processor_layout(r) for r in requests])
    for mels, out in zip(requests, got, strict=True):
        expected = _reference(ref, mels)
        assert out.shape == expected.shape
        assert (out - expected).abs().max().item() < TOL
