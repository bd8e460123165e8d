"""Code2Wav loaded from a real-layout tiny checkpoint equals transformers' Qwen3OmniMoeCode2Wav
(whole decode), and streamed chunks equal the whole decode at any chunking."""

from __future__ import annotations

import pytest
import torch
from mstar.layers.streaming import StreamState
from mstar.model.submodule_base import (
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    PerRequestState,
)
from mstar.weights import load_weights
from mstar_qwen3omni.checkpoint_keys import CODE2WAV_KEYS
from mstar_qwen3omni.code2wav import Code2Wav
from mstar_qwen3omni.code2wav_config import Code2WavConfig
from mstar_qwen3omni.code2wav_node import AUDIO, CODE_CHUNK
from mstar_qwen3omni.speech_loading import build_code2wav_node
from speech_helpers import checkpoint_config, speech_model

TOL = 1e-5
FRAMES = 23  # well past the 6-frame attention window and every convolution's reach


@pytest.fixture(scope="module")
def models():
    ref, root = speech_model()
    ours = Code2Wav(Code2WavConfig.from_config(checkpoint_config(root))).eval()
    load_weights(ours, root, **CODE2WAV_KEYS)
    return ref.code2wav, ours


def _codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 32, (batch, 4, frames), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_whole_decode_equals_transformers(models):
    ref, ours = models
    codes = _codes(3, FRAMES, seed=1)
    expected, got = ref(codes), ours(codes)
    assert got.shape == expected.shape == (3, 1, ours.whole_length(FRAMES))
    assert (expected.abs() < 1).float().mean() > 0.99  # the clamp does not hide the comparison
    err = (got - expected).abs().max().item()
    print(f"max |code2wav - transformers| = {err:.2e}")
    assert err < TOL


@pytest.mark.parametrize("splits", [[1, 5, 17], [7, 7, 7, 2], [3] * 7 + [2], [22, 1]])
@torch.no_grad()
def test_streamed_chunks_equal_the_whole_decode(models, splits):
    """float64, so any seam error shows far above rounding (1e-12)."""
    ours = models[1].double()
    try:
        codes = _codes(2, FRAMES, seed=2)
        whole = ours(codes)
        state = StreamState(2)
        chunks = [ours.stream(c, state) for c in torch.split(codes, splits, dim=-1)]
        assert chunks[0].shape[-1] == ours.whole_length(splits[0])
        assert all(c.shape[-1] == n * ours.cfg.samples_per_frame for c, n in zip(chunks[1:], splits[1:], strict=True))
        assert (torch.cat(chunks, dim=-1) - whole).abs().max().item() < 1e-12
    finally:
        ours.float()


@torch.no_grad()
def test_streams_at_different_offsets_share_calls(models):
    """Three streams advancing by different chunk sizes; each stream's audio equals its own
    whole decode (float32), and the carried state stops growing."""
    ours = models[1]
    codes = [_codes(1, FRAMES, seed=10 + i)[0] for i in range(3)]
    plans = [[4, 4, 4, 4, 4, 3], [1, 4, 4, 4, 4, 6], [4, 1, 4, 4, 4, 6]]
    states: list[StreamState | None] = [None, None, None]
    audio: list[list[torch.Tensor]] = [[], [], []]
    offsets = [0, 0, 0]
    sizes = []
    for step in range(6):
        chunks = []
        for i in range(3):
            n = plans[i][step]
            chunks.append(codes[i][:, offsets[i] : offsets[i] + n])
            offsets[i] += n
        wavs, states = ours.stream_chunks(chunks, states)
        for i in range(3):
            audio[i].append(wavs[i])
        sizes.append(states[0].nbytes)
    for i in range(3):
        whole = ours(codes[i][None])[0, 0]
        assert (torch.cat(audio[i]) - whole).abs().max().item() < TOL
    assert sizes[2] == sizes[-1]


@torch.no_grad()
def test_transformers_chunked_decode_is_not_the_whole_decode(models):
    """Why Code2Wav streams with carried state: transformers' chunked_decode loses each chunk's
    trimmed tail and sees only its left context."""
    ref, _ = models
    codes = _codes(1, FRAMES, seed=3)
    whole, chunked = ref(codes), ref.chunked_decode(codes, chunk_size=8, left_context_size=2)
    assert chunked.shape[-1] < whole.shape[-1]


def test_codes_outside_the_codebook_are_rejected(models):
    ours = models[1]
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        ours(torch.full((1, 4, 3), 32))
    with pytest.raises(ValueError, match="codes must be"):
        ours(torch.zeros(1, 3, 3, dtype=torch.long))


def _node_steps(node, plans: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Feed each request's chunks [T, Q] through the node contract, one chunk per step, all
    requests in each step; the per-request state lives in PerRequestState as the engine keeps it."""
    states = {rid: PerRequestState() for rid in plans}
    audio: dict[str, list[torch.Tensor]] = {rid: [] for rid in plans}
    for step in range(max(len(c) for c in plans.values())):
        rids = [rid for rid, chunks in plans.items() if step < len(chunks)]
        infos = {rid: CurrentForwardPassInfo(request_id=rid, walk="code2wav", request_kwargs={}) for rid in rids}
        inputs = [node.prepare_inputs("code2wav", infos[rid], {CODE_CHUNK: plans[rid][step]}) for rid in rids]
        engine_inputs = ModelInputsFromEngine(request_ids=rids, per_request_info=infos, per_request_states=states)
        out = node.forward_batched("code2wav", engine_inputs, **node.preprocess("code2wav", engine_inputs, inputs))
        for rid in rids:
            audio[rid].append(out.per_rid_outputs[rid][AUDIO])
    return {rid: torch.cat(a) for rid, a in audio.items()}


@torch.no_grad()
def test_node_streams_equal_whole_decodes_and_bytes_do_not_depend_on_the_batch(models):
    _, ours = models
    root = speech_model()[1]
    node = build_code2wav_node(checkpoint_config(root), root, "cpu", batch=4)
    frames = {rid: _codes(1, FRAMES, seed=20 + i)[0].T for i, rid in enumerate("abc")}  # [T, Q]
    plans = {
        "a": list(torch.split(frames["a"], [3, 3, 3, 3, 3, 3, 3, 2])),
        "b": list(torch.split(frames["b"], [1, 3, 3, 3, 3, 3, 3, 4])),
        "c": list(torch.split(frames["c"], [3, 2, 3, 3, 3, 3, 6])),
    }
    together = _node_steps(node, plans)
    alone = _node_steps(node, {"a": plans["a"]})
    for rid in plans:
        whole = ours(frames[rid].T[None])[0, 0]
        assert (together[rid] - whole).abs().max().item() < TOL, rid
    assert torch.equal(alone["a"], together["a"])
