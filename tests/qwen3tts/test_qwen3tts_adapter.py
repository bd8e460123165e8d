"""The API adapter: speech requests → prompt inputs; unimplemented features → 400."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from mstar.api import ApiError
from mstar.api.protocol import SpeechRequest
from mstar.api.sampling import request_sampling, resolve_sampling
from mstar.plugins.discovery import resolve_model
from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
from mstar_qwen3tts.config import load_config
from mstar_qwen3tts.plugin import mstar_node_samplers
from qwen3tts_helpers import speech_inputs


@pytest.fixture(scope="module")
def adapter(tiny_ckpt) -> Qwen3TTSApiAdapter:
    return Qwen3TTSApiAdapter(load_config(tiny_ckpt), tiny_ckpt)


def _speech(**fields) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": "qwen3tts", "input": "Hello there, world!", **fields})


@pytest.mark.parametrize(
    ("fields", "speaker", "language", "layout"),
    [
        ({"voice": "ryan"}, "ryan", "auto", True),
        ({"voice": "Dylan", "language": "Chinese", "non_streaming_mode": False}, "dylan", "chinese", False),
        ({}, "vivian", "auto", True),  # no voice: the checkpoint's first speaker
    ],
)
def test_speech_inputs(adapter, tiny_ckpt, fields, speaker, language, layout) -> None:
    req = adapter.speech_inputs(_speech(**fields))
    want = speech_inputs(tiny_ckpt, "Hello there, world!", speaker, language, layout)
    assert req.inputs.keys() == want.keys()
    assert all(torch.equal(req.inputs[k], want[k]) for k in want)
    assert req.prompt_tokens == len(want["text_ids"])


@pytest.mark.parametrize(
    ("fields", "param", "feature"),
    [
        ({"instructions": "whisper"}, "instructions", "instruct"),
        ({"ref_audio": "clip.wav", "ref_text": "hi"}, "ref_audio", "Base checkpoint"),
        ({"speed": 1.5}, "speed", "speed"),
        ({"voice": "alloy"}, "voice", "unknown speaker"),
        ({"language": "klingon"}, "language", "unknown language"),
        ({"non_streaming_mode": "yes"}, "non_streaming_mode", "boolean"),
    ],
)
def test_rejected_requests_name_the_field(adapter, fields, param, feature) -> None:
    with pytest.raises(ApiError) as err:
        adapter.speech_inputs(_speech(**fields))
    assert err.value.status == 400 and err.value.param == param and feature in err.value.message


def test_per_label_sampling_and_unknown_labels(tiny_ckpt) -> None:
    samplers = mstar_node_samplers(load_config(tiny_ckpt))
    req = _speech(temperature=0.3, seed=9, sampling={"top_k": 5, "aux": {"code_predictor": {"temperature": 0.7, "top_p": 0.9}}})
    configs, seeds = resolve_sampling(samplers, "talker", request_sampling(req, max_tokens=("max_tokens", 20)))
    cfg = configs["talker"]
    assert (cfg["main"]["temperature"], cfg["main"]["top_k"], cfg["main"]["max_tokens"], seeds["talker"]) == (0.3, 5, 20, 9)
    assert (cfg["aux"]["code_predictor"]["temperature"], cfg["aux"]["code_predictor"]["top_p"]) == (0.7, 0.9)
    assert cfg["aux"]["code_predictor"]["top_k"] == 50  # the generation_config default stays
    bad = _speech(sampling={"aux": {"residual": {"temperature": 0.7}}})
    with pytest.raises(ApiError) as err:
        resolve_sampling(samplers, "talker", request_sampling(bad))
    assert err.value.status == 400 and "residual" in err.value.message and "code_predictor" in err.value.message


def test_adapter_pickles_without_its_tokenizer(adapter) -> None:
    adapter.speech_inputs(_speech())  # loads the tokenizer
    clone = pickle.loads(pickle.dumps(adapter))
    assert clone._tokenizer is None
    assert torch.equal(clone.speech_inputs(_speech()).inputs["text_ids"], adapter.speech_inputs(_speech()).inputs["text_ids"])


def test_warmup_request_is_valid(adapter) -> None:
    warm = adapter.warmup_request()
    assert adapter.speech_inputs(warm).inputs["text_ids"].numel() > 0
    # Frames for the first chunk, a whole one and a shorter last one (each a codec shape
    # compile_regions compiles), and no early stop before them.
    s = adapter.cfg.streaming
    assert warm.min_tokens == warm.max_tokens
    assert (warm.max_tokens - s.first_chunk - s.chunk) % s.chunk > 0 and warm.max_tokens > s.first_chunk + s.chunk


def test_checkpoint_resolves_by_architecture(tiny_ckpt) -> None:
    assert resolve_model(tiny_ckpt).name == "qwen3tts"
    assert resolve_model("qwen3-tts").name == "qwen3tts"


def test_check_plugin_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mstar.cli", "check-plugin", "qwen3tts"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all" in proc.stdout and "checks passed" in proc.stdout
