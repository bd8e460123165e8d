"""Streaming audio: the codec decodes left-context chunks while the talker still runs; a
small first chunk starts audio early; seams never change the audio."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar.weights import load_weights
from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS
from mstar_qwen3tts.codec_node import CodecNode
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import frames, sampling, speech_inputs

FRAMES = 30


def _fixed_length(n: int, **main) -> dict:
    # min_tokens == max_tokens bars EOS: exactly n frames.
    return sampling({"max_tokens": n, "min_tokens": n, "seed": 5, **main}, {})


def _whole_decode(engine, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return engine.core.nodes["codec"].submodule.decode(codes)


def test_first_audio_arrives_before_generation_ends(tiny_engine, tiny_ckpt, tiny_cfg) -> None:
    events = list(tiny_engine.generate(speech_inputs(tiny_ckpt, "Streaming starts early."), _fixed_length(FRAMES)))
    signals = [e.signal for e in events if e.signal is not None]
    assert signals.count("codes") == FRAMES
    last_codes = len(signals) - 1 - signals[::-1].index("codes")
    assert signals.index("audio") < last_codes, "no audio before the talker finished"
    # Frames before the first audio: the small first chunk, not a full one.
    s = tiny_cfg.streaming
    assert signals[: signals.index("audio")].count("codes") < s.chunk
    spf = tiny_cfg.codec.samples_per_frame
    chunks = [e.data.numel() for e in events if e.signal == "audio"]
    assert chunks[0] == s.first_chunk * spf
    assert all(c == s.chunk * spf for c in chunks[1:-1])
    assert sum(chunks) == FRAMES * spf


@pytest.mark.parametrize("non_streaming_mode", [True, False])
def test_streamed_audio_equals_one_whole_decode(tiny_engine, tiny_ckpt, tiny_cfg, non_streaming_mode: bool) -> None:
    inputs = speech_inputs(tiny_ckpt, "Seams must not be heard at all.", "eric", "chinese", non_streaming_mode)
    result = tiny_engine.run_batch([{"inputs": inputs, "sampling": _fixed_length(FRAMES)}])[0]
    assert result.error is None, result.error
    assert len(result.signals["audio"]) > 2  # several chunks, so there are seams
    whole = _whole_decode(tiny_engine, frames(result, tiny_cfg.talker.num_code_groups))
    torch.testing.assert_close(result.cat("audio"), whole, atol=1e-5, rtol=0)


def test_too_little_left_context_changes_audio(engines, tmp_path: Path, tiny_cfg) -> None:
    """The streaming knobs come from config.json's ``mstar_streaming``; a codec that carries
    no state and re-decodes less than its receptive field makes the seams audible."""
    overrides = {"mstar_streaming": {"chunk": 5, "first_chunk": 2, "left_context": 1, "stateful": False}}
    ckpt = write_checkpoint(tmp_path, overrides=overrides)
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    assert (cfg.streaming.chunk, cfg.streaming.first_chunk, cfg.streaming.left_context) == (5, 2, 1)
    assert not cfg.streaming.stateful
    engine = engines(ckpt)
    result = engine.run_batch([{"inputs": speech_inputs(ckpt, "Seams."), "sampling": _fixed_length(FRAMES)}])[0]
    assert [a.numel() for a in result.signals["audio"]][:2] == [2 * cfg.codec.samples_per_frame, 5 * cfg.codec.samples_per_frame]
    whole = _whole_decode(engine, frames(result, cfg.talker.num_code_groups))
    assert (result.cat("audio") - whole).abs().max() > 1e-3


@pytest.mark.parametrize("preset", ["tiny", "mid"])
def test_receptive_field_makes_any_chunk_exact(tmp_path: Path, preset: str) -> None:
    """A window with ``receptive_field_frames`` of left context decodes its new frames
    exactly as the whole sequence does, at any offset (mid keeps the real upsampling)."""
    cfg = Qwen3TTSConfig.from_dict(load_config(write_checkpoint(tmp_path, preset=preset)))
    codec = CodecNode(cfg.codec)
    load_weights(codec, tmp_path / CODEC_DIR, **CODEC_KEYS)
    rf = cfg.codec.receptive_field_frames()
    n = rf + 12
    codes = torch.randint(0, cfg.codec.codebook_size, (n, cfg.codec.num_quantizers), generator=torch.Generator().manual_seed(0))
    spf = cfg.codec.samples_per_frame
    with torch.inference_mode():
        whole = codec.decode(codes)
        for start in (1, rf // 2, rf, rf + 5):
            window = codes[max(0, start - rf) : start + 4]
            part = codec.decode(window, context=min(start, rf))
            # Only rounding differs: conv kernels pick other algorithms for other lengths.
            torch.testing.assert_close(part, whole[start * spf : (start + 4) * spf], atol=1e-4, rtol=0)
