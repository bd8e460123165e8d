"""Stateful codec streaming: each chunk is decoded from its new frames plus the decoder's
carried state (conv left contexts, transposed-conv overlaps, the sliding-window KV), and
the chunks join to one whole decode, also past the released codec's 580-frame exact
left context. The 60 s check at the full released width is in
``benchmarks/codec_streaming.py`` (minutes on this CPU)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from mstar.layers.streaming import StreamState
from mstar_qwen3tts.codec_released import random_codec, released_codec_config
from qwen3tts_helpers import frames, sampling, speech_inputs

FRAMES = 30


@pytest.fixture(scope="module")
def released_window_codec():
    """The released decoder (8 layers, window 72, hidden 512, real upsampling: exact left
    context 580 frames) with narrower convolution channels so a CPU test stays short."""
    cfg = released_codec_config(latent_dim=64, decoder_dim=32)
    assert cfg.receptive_field_frames() == 580 == released_codec_config().receptive_field_frames()
    return random_codec(cfg).double()


def test_stream_equals_whole_decode_past_the_exact_left_context(released_window_codec) -> None:
    codec = released_window_codec
    n = 605  # 48.4 s of audio: later chunks sit wholly beyond the 580-frame context
    codes = torch.randint(0, codec.cfg.codebook_size, (n, codec.cfg.num_quantizers), generator=torch.Generator().manual_seed(3))
    sizes = [4, 1, 12, 7]
    sizes += [12] * ((n - sum(sizes)) // 12)
    sizes += [n - sum(sizes)] if n > sum(sizes) else []
    state = StreamState()
    with torch.inference_mode():
        whole = codec.decode(codes)
        parts = []
        for chunk in codes.split(sizes):
            parts.append(codec.decode_chunk(chunk, state))
    assert whole.numel() == n * codec.cfg.samples_per_frame
    assert float(whole.abs().max()) > 0.1
    # float64: the streamed arithmetic is the whole decode's, reordered (measured ~2e-14).
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-10, rtol=0)


def test_engine_feeds_each_frame_to_the_codec_once_and_frees_the_state(tiny_engine, tiny_cfg, tiny_ckpt, monkeypatch) -> None:
    node = tiny_engine.core.nodes["codec"].submodule
    assert node.stateful
    seen: list[int] = []
    states: list[weakref.ref] = []
    decode_chunks = node.decode_chunks

    def spy(codes: list[torch.Tensor], carried: list[StreamState]) -> tuple[list[torch.Tensor], list[StreamState]]:
        seen.extend(c.shape[0] for c in codes)
        audio, advanced = decode_chunks(codes, carried)
        states.extend(weakref.ref(s) for s in advanced)
        return audio, advanced

    monkeypatch.setattr(node, "decode_chunks", spy)
    fixed = sampling({"max_tokens": FRAMES, "min_tokens": FRAMES, "seed": 5}, {})
    result = tiny_engine.run_batch([{"inputs": speech_inputs(tiny_ckpt, "Every frame once."), "sampling": fixed}])[0]
    assert result.error is None, result.error
    s = tiny_cfg.streaming
    assert seen[0] == s.first_chunk and all(k == s.chunk for k in seen[1:-1]) and sum(seen) == FRAMES
    gc.collect()
    assert all(ref() is None for ref in states), "the request's codec state outlived the request"
    with torch.inference_mode():
        whole = node.decode(frames(result, tiny_cfg.talker.num_code_groups))
    torch.testing.assert_close(result.cat("audio"), whole, atol=1e-5, rtol=0)
