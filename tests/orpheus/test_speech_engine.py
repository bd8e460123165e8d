"""End to end through ``mstar.Engine``: audio equals the official pipeline over
``transformers`` + ``snac``; streaming; seeds; stopping on end-of-speech."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mstar.api.audio import encode_audio
from mstar_orpheus.checkpoint import write_checkpoint
from orpheus_reference import (
    END_OF_SPEECH,
    engine_int16,
    hf_greedy,
    official_prompt,
    official_stream_audio,
)
from safetensors.torch import load_file, save_file

GREEDY = {"temperature": 0, "repetition_penalty": 1.3, "max_tokens": 64}


def _speech(engine, prompt: list[int] | torch.Tensor, sampling: dict, **kw):
    result = engine.run_batch([{"inputs": {"prompt_ids": torch.as_tensor(prompt)}, "sampling": sampling, **kw}])[0]
    assert result.error is None, result.error
    return result


@pytest.mark.parametrize("voice,text", [("tara", "Hello there, how are you?"), ("zac", "Short.")])
def test_greedy_audio_equals_transformers_plus_official_decoder_plus_snac(quiet_ckpt, engines, voice, text):
    prompt = official_prompt(quiet_ckpt, text, voice)
    result = _speech(engines(quiet_ckpt), prompt, GREEDY)
    ref_tokens = hf_greedy(quiet_ckpt, prompt, GREEDY["max_tokens"], repetition_penalty=GREEDY["repetition_penalty"])
    assert result.cat("token").tolist() == ref_tokens
    ref = official_stream_audio(quiet_ckpt, ref_tokens)
    ours = engine_int16(result.cat("audio"))
    assert len(ref) >= 4 * 2048  # windows at 28, 35, ..., 63 codes
    assert ours.shape == ref.shape
    assert int(np.abs(ours.astype(np.int32) - ref.astype(np.int32)).max()) <= 1


@pytest.fixture(scope="module")
def eos_ckpt(tmp_path_factory) -> Path:
    """The quiet checkpoint with an LM head that always prefers end-of-speech: how long
    speech runs is then set by min_tokens alone."""
    path = write_checkpoint(tmp_path_factory.mktemp("orpheus-eos"), seed=1, snac={"noise": False})
    state = load_file(path / "model.safetensors")
    head = state["lm_head.weight"]
    head[END_OF_SPEECH, 1:8] = 2 * head[:, 1:8].max()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_stops_on_end_of_speech_which_never_reaches_the_decoder(eos_ckpt, engines):
    prompt = official_prompt(eos_ckpt, "Stop here.", "leah")
    engine = engines(eos_ckpt)
    assert _speech(engine, prompt, GREEDY).cat("token").tolist() == [END_OF_SPEECH]
    result = _speech(engine, prompt, {**GREEDY, "min_tokens": 35})
    tokens = result.cat("token").tolist()
    assert result.finish_reason == "stop" and len(tokens) == 36 and tokens[-1] == END_OF_SPEECH
    assert tokens == hf_greedy(eos_ckpt, prompt, 64, repetition_penalty=1.3, min_new_tokens=35)
    ours = engine_int16(result.cat("audio"))
    assert len(ours) == 2 * 2048  # windows at 28 and 35 codes; the stop token adds none
    assert np.abs(ours.astype(np.int32) - official_stream_audio(eos_ckpt, tokens).astype(np.int32)).max() <= 1


def test_audio_streams_while_the_lm_decodes_and_equals_the_whole(ckpt, engines, prompts):
    engine = engines(ckpt)
    ids = prompts.encode("Streaming, chunk by chunk.", "mia")
    sampling = {"seed": 11, "max_tokens": 60}
    events = []
    for out in engine.generate({"prompt_ids": ids}, sampling):
        events.append((time.monotonic(), out))
    tokens = [(t, o) for t, o in events if o.signal == "token"]
    audio = [(t, o) for t, o in events if o.signal == "audio"]
    assert len(tokens) == 60 and len(audio) == 5  # windows at 28, 35, ..., 56 codes
    assert audio[0][0] < tokens[-1][0]  # the first chunk arrived before generation ended
    assert events.index(audio[0]) < events.index(tokens[-1])
    streamed = torch.cat([o.data for _, o in audio])
    whole = _speech(engine, ids, sampling).cat("audio")
    assert torch.equal(streamed, whole)


def _wav(result) -> bytes:
    return encode_audio(result.cat("audio").numpy(), 24000, "wav")


def test_seeded_request_gives_identical_wav_over_repeats_and_beside_eight_others(ckpt, engines, prompts):
    engine = engines(ckpt)
    seeded = {"inputs": {"prompt_ids": prompts.encode("The same every time.", "jess")}, "sampling": {"seed": 1234, "max_tokens": 56}}
    first = _wav(engine.run_batch([seeded])[0])
    assert len(first) > 44 + 2 * 2048 * 2
    assert _wav(engine.run_batch([seeded])[0]) == first
    others = [{"inputs": {"prompt_ids": prompts.encode(f"Another request, number {i}.", v)}, "sampling": {"max_tokens": 30 + 3 * i}}
              for i, v in enumerate(["tara", "leah", "leo", "dan", "mia", "zac", "zoe", "tara"])]
    crowded = engine.run_batch([*others[:4], seeded, *others[4:]])
    assert all(r.error is None for r in crowded)
    assert _wav(crowded[4]) == first


def test_unseeded_requests_differ(ckpt, engines, prompts):
    engine = engines(ckpt)
    req = {"inputs": {"prompt_ids": prompts.encode("Fresh randomness.", "dan")}, "sampling": {"max_tokens": 40}}
    a, b = engine.run_batch([req, req])
    assert a.cat("token").tolist() != b.cat("token").tolist()
