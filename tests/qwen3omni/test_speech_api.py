"""The Qwen3-Omni API adapter's speech side, on the tiny checkpoint's tokenizer: voices from
``talker_config.speaker_id`` (Ethan first, matched case-insensitively, others a 400 listing
them), chat with audio out and ``/v1/audio/speech`` as engine kwargs and prompts."""

from __future__ import annotations

import pytest
from mstar.api.adapter import CHAT, SPEECH
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, SpeechRequest
from mstar.text import chat_prompt_ids
from mstar_qwen3omni.adapter import (
    SAMPLE_RATE,
    SPEECH_SYSTEM_PROMPT,
    OmniChatAdapter,
    speaker_names,
)
from mstar_qwen3omni.media import MediaLimits
from mstar_qwen3omni.plugin import _load_config, text_view

SPEAKERS = {"talker_config": {"speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}}}


@pytest.fixture(scope="module")
def adapters(omni_ckpt):
    config = _load_config(omni_ckpt)
    speaking = OmniChatAdapter(omni_ckpt, text_view(config), "thinker", MediaLimits(), speaker_names(SPEAKERS))
    silent = OmniChatAdapter(omni_ckpt, text_view(config), "thinker", MediaLimits())
    return speaking, silent


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hello"}], **fields)


def test_voices_are_the_checkpoints_speakers_ethan_first(adapters):
    speaking, silent = adapters
    assert [v.name for v in speaking.voices()] == ["ethan", "chelsie", "aiden"]
    assert speaking.audio_voice(None) == "ethan" and speaking.audio_voice("Chelsie") == "chelsie"
    with pytest.raises(ApiError) as err:
        speaking.audio_voice("alloy", "audio.voice")
    assert err.value.param == "audio.voice" and all(n in err.value.message for n in ("ethan", "chelsie", "aiden"))
    # A Thinker-only checkpoint serves text: no voices, no chat audio, no speech endpoint.
    assert speaker_names({}) == [] and silent.voices() == []
    assert not silent.chat_audio and silent.audio_signal is None and not silent.serves(SPEECH) and silent.serves(CHAT)
    assert speaking.chat_audio and speaking.audio_signal == "audio" and speaking.sample_rate == SAMPLE_RATE == 24000
    assert speaking.serves(SPEECH)


def test_chat_with_audio_sets_the_engine_kwargs(adapters):
    speaking, _ = adapters
    text = speaking.chat_inputs(chat())
    assert "modalities" not in text.kwargs and "voice" not in text.kwargs
    spoken = speaking.chat_inputs(chat(modalities=["text", "audio"], audio={"voice": "AIDEN", "format": "wav"}))
    assert spoken.kwargs == {"modalities": ["text", "audio"], "voice": "aiden"}
    assert spoken.inputs["prompt_ids"].tolist() == text.inputs["prompt_ids"].tolist()
    default = speaking.chat_inputs(chat(modalities=["text", "audio"]))
    assert default.kwargs["voice"] == "ethan"


def test_speech_is_a_chat_prompt_asking_to_read_the_input(adapters):
    speaking, _ = adapters
    req = speaking.speech_inputs(SpeechRequest(model="m", input="Good morning.", voice="Chelsie"))
    want = chat_prompt_ids(speaking.tokenizer, [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": "Good morning."}])
    assert req.inputs["prompt_ids"].tolist() == want and req.prompt_tokens == len(want)
    assert req.kwargs == {"modalities": ["text", "audio"], "voice": "chelsie"}
    for fields, param in (({"voice": "nova"}, "voice"), ({"instructions": "whisper"}, "instructions"), ({"speed": 1.5}, "speed")):
        with pytest.raises(ApiError) as err:
            speaking.speech_inputs(SpeechRequest(model="m", input="x", **fields))
        assert (err.value.status, err.value.param) == (400, param)
