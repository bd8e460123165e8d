"""Chat audio output in the API process: ``modalities`` / ``audio`` checked against the
adapter's contract (audio output, voices) and the encoder's formats, and the containers."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from mstar.api.adapter import ApiAdapter, Voice
from mstar.api.audio import CHAT_AUDIO_FORMATS, encode_audio, to_pcm16
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.server.routes_chat import check_chat_request


class Speaking(ApiAdapter):
    endpoints = frozenset({"chat"})
    text_signal = "tokens"
    audio_signal = "audio"
    chat_audio = True

    def __init__(self, sample_rate: int = 24000) -> None:
        self.sample_rate = sample_rate

    def voices(self) -> list[Voice]:
        return [Voice("Ethan"), Voice("Chelsie")]


class TextOnly(ApiAdapter):
    endpoints = frozenset({"chat"})
    text_signal = "tokens"


def rt(adapter: ApiAdapter) -> SimpleNamespace:
    return SimpleNamespace(adapter=adapter, model_name="m", check_model=lambda name: None)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], modalities=["text", "audio"], **fields)


def rejected(adapter: ApiAdapter, req: ChatCompletionRequest) -> ApiError:
    with pytest.raises(ApiError) as err:
        check_chat_request(rt(adapter), req)
    assert err.value.status == 400
    return err.value


def test_a_model_without_audio_output_names_modalities():
    err = rejected(TextOnly(), chat())
    assert err.param == "modalities"
    check_chat_request(rt(TextOnly()), chat().model_copy(update={"modalities": ["text"]}))


@pytest.mark.parametrize("fmt", [*CHAT_AUDIO_FORMATS, "pcm"])
def test_every_listed_format_is_accepted(fmt):
    check_chat_request(rt(Speaking()), chat(audio={"voice": "Ethan", "format": fmt}))


def test_unknown_format_names_the_field_and_lists_the_formats():
    err = rejected(Speaking(), chat(audio={"voice": "Ethan", "format": "aac"}))
    assert err.param == "audio.format" and "'aac'" in err.message
    assert all(f in err.message for f in CHAT_AUDIO_FORMATS)


def test_opus_needs_an_opus_sample_rate():
    check_chat_request(rt(Speaking(24000)), chat(audio={"format": "opus"}))
    err = rejected(Speaking(22050), chat(audio={"format": "opus"}))
    assert err.param == "audio.format" and "22050" in err.message


def test_streamed_audio_is_pcm16():
    assert rejected(Speaking(), chat(audio={"format": "wav"}, stream=True)).param == "audio.format"
    check_chat_request(rt(Speaking()), chat(audio={"format": "pcm16"}, stream=True))


def test_unknown_voice_lists_the_voices():
    err = rejected(Speaking(), chat(audio={"voice": "alloy", "format": "wav"}))
    assert err.param == "audio.voice" and err.code == "unknown_voice"
    assert "Ethan" in err.message and "Chelsie" in err.message
    # OpenAI's custom-voice form names a voice by id.
    check_chat_request(rt(Speaking()), chat(audio={"voice": {"id": "Chelsie"}, "format": "wav"}))
    assert rejected(Speaking(), chat(audio={"voice": {"id": "nope"}})).param == "audio.voice"


def test_audio_voice_defaults_to_the_first_and_models_without_voices_take_any():
    assert Speaking().audio_voice(None) == "Ethan"
    assert Speaking().audio_voice("Chelsie") == "Chelsie"
    assert TextOnly().audio_voice("anything") == "anything"


def tone(n: int = 4800, rate: int = 24000) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / rate) - 0.6 * (np.arange(n) % 97 == 0)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_containers_hold_the_pcm16_samples(fmt):
    x = tone()
    data, rate = sf.read(io.BytesIO(encode_audio(x, 24000, fmt)), dtype="int16")
    assert rate == 24000 and data.tobytes() == to_pcm16(x) == encode_audio(x, 24000, "pcm16")


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_lossy_containers_decode_to_the_clip(fmt):
    x = tone(24000)
    blob = encode_audio(x, 24000, fmt)
    assert blob == encode_audio(x, 24000, fmt)  # the same clip, the same bytes
    data, rate = sf.read(io.BytesIO(blob), dtype="float32")
    assert rate == 24000 and abs(len(data) - len(x)) <= 2048
    # A lossy codec: the clip correlates with the input, after its encoder delay.
    best = max(float(np.corrcoef(x[: 20000], data[d : d + 20000])[0, 1]) for d in range(0, 1200, 1))
    assert best > 0.9
