"""Saved voices of qwen3tts, in process: a stored clone prompt gives the same engine inputs as
the same clip sent inline (``ref_audio``, once the encoder nodes encoded its features), in both clone modes; only Base checkpoints make
voices; bad options and mixed requests are 400s naming the field."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from mstar.api import ApiError
from mstar.api.protocol import SpeechRequest
from mstar.api.voices import EngineVoice, SavedVoice, VoiceUpload
from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
from mstar_qwen3tts.config import load_config
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import encoded_inputs


def clip_wav(rate: int = 16000, seconds: float = 1.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 200 * t) * np.linspace(0.2, 1, t.size)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Qwen3TTSApiAdapter:
    ckpt = write_checkpoint(tmp_path_factory.mktemp("base"), kind="base")
    return Qwen3TTSApiAdapter(load_config(ckpt), ckpt)


def speech(**fields: object) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": "m", "input": "Hi there.", **fields})


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def made(base: Qwen3TTSApiAdapter, upload: VoiceUpload) -> dict[str, torch.Tensor]:
    """The voice's tensors: the engine request ``voice_tensors`` returns, its outputs made by
    the encoder nodes' encoders (as the engines would), joined to what the pool computed."""
    voice = base.voice_tensors(upload.decode())
    assert isinstance(voice, EngineVoice) and voice.kwargs["encode_only"] is True
    assert base.checkpoint_dir is not None
    encoded = encoded_inputs(base.checkpoint_dir, voice.inputs)
    return {**voice.tensors, **{name: encoded[name] for name in voice.outputs}}


@pytest.mark.parametrize(("transcript", "options", "inline"), [
    ("Hello there.", {}, {"ref_text": "Hello there."}),  # in-context: codes + transcript
    (None, {}, {"x_vector_only_mode": True}),  # no transcript: speaker embedding only
    ("Hello there.", {"x_vector_only_mode": "true"}, {"x_vector_only_mode": True}),
])
def test_saved_voice_equals_inline_reference(base: Qwen3TTSApiAdapter, transcript: str | None, options: dict, inline: dict) -> None:
    wav = clip_wav()
    tensors = made(base, VoiceUpload(wav, transcript, 30.0, options))
    assert set(tensors) == {"speaker_embed", "ref_codes", "ref_text_ids"}
    assert (tensors["ref_codes"].shape[0] > 0) == ("ref_text" in inline)
    saved = base.speech_inputs_with_voice(speech(voice="v"), SavedVoice("v", tensors, transcript)).inputs
    # Inline, the pool sends the clip's features and the engine's encoder nodes encode them.
    assert base.checkpoint_dir is not None
    inline_inputs = base.speech_inputs(speech(ref_audio=base64.b64encode(wav).decode(), **inline)).inputs
    assert same(saved, encoded_inputs(base.checkpoint_dir, inline_inputs))
    other = made(base, VoiceUpload(clip_wav(seconds=0.7), transcript, 30.0, options))
    assert not torch.equal(other["speaker_embed"], tensors["speaker_embed"])  # the clip matters


def test_only_base_checkpoints_make_voices(tmp_path: Path, base: Qwen3TTSApiAdapter) -> None:
    ckpt = write_checkpoint(tmp_path / "cv", kind="custom_voice")
    assert base.creates_voices and not Qwen3TTSApiAdapter(load_config(ckpt), ckpt).creates_voices


@pytest.mark.parametrize(("transcript", "options", "param"), [
    (None, {"x_vector_only_mode": "false"}, "transcript"),  # in-context cloning needs a transcript
    (None, {"x_vector_only_mode": "maybe"}, "x_vector_only_mode"),
    (None, {"language": "english"}, "language"),  # not an option of a voice
])
def test_bad_uploads_name_the_field(base: Qwen3TTSApiAdapter, transcript: str | None, options: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        base.voice_tensors(VoiceUpload(clip_wav(), transcript, 30.0, options).decode())
    assert (err.value.status, err.value.param) == (400, param)


def test_a_saved_voice_with_an_inline_reference_is_a_400(base: Qwen3TTSApiAdapter) -> None:
    tensors = made(base, VoiceUpload(clip_wav(), None, 30.0))
    with pytest.raises(ApiError) as err:
        base.speech_inputs_with_voice(speech(voice="v", ref_audio="AAAA"), SavedVoice("v", tensors))
    assert err.value.param == "ref_audio"
