"""``/v1/audio/transcriptions`` and ``/translations`` on the Thinker: the upload becomes a
chat of one user message holding the audio and an instruction, answered in text (the
Talker does not run).

    Transcribe the audio.                       (no language)
    Transcribe the audio in English.            (language "en"; an unknown code is named as sent)
    Translate the audio into English.           (translations)

OpenAI's ``prompt`` (context for the model) follows the instruction as ``Context: ...``. The
chat is templated and its audio turned into features by transformers' processor, as a chat
with an audio part is (``processing.Preprocessor.process_decoded``), so a transcription is the
chat ``transcription_messages`` returns with that audio.
"""

from __future__ import annotations

from typing import Any

import torch
from mstar.api.adapter import EngineRequest
from mstar.api.errors import ApiError
from mstar.api.transcription import TRANSLATE, TranscriptionRequest
from mstar.text.lm import PROMPT

from mstar_qwen3omni.media import _resample

LANGUAGES = {
    "en": "English", "zh": "Chinese", "de": "German", "es": "Spanish", "fr": "French", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "pt": "Portuguese", "ru": "Russian", "ar": "Arabic", "nl": "Dutch",
}


def instruction(task: str, language: str | None = None, prompt: str | None = None) -> str:
    if task == TRANSLATE:
        text = "Translate the audio into English."
    elif language:
        text = f"Transcribe the audio in {LANGUAGES.get(language.lower(), language)}."
    else:
        text = "Transcribe the audio."
    return f"{text} Context: {prompt}" if prompt else text


def transcription_messages(task: str, language: str | None = None, prompt: str | None = None) -> list[dict[str, Any]]:
    """The chat a transcription is: the audio, then the instruction, in one user message."""
    return [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": instruction(task, language, prompt)}]}]


def transcription_inputs(adapter: Any, request: TranscriptionRequest) -> EngineRequest:
    """The Thinker's inputs for ``request`` (``adapter``: the model's ``OmniChatAdapter``)."""
    pre = adapter.preprocessor
    wave = _resample(request.audio, request.sample_rate, pre.audio_rate)
    try:
        wave = pre._long_enough(wave, "file")
    except ValueError as exc:
        raise ApiError(400, str(exc), param="file", code="invalid_audio") from None
    out = pre.process_decoded(transcription_messages(request.task, request.language, request.prompt), [], [], [wave], [None])
    ids = out.input_ids
    if len(ids) >= adapter.max_len:
        raise ApiError(400, f"the audio makes a prompt of {len(ids)} tokens; this model holds at most {adapter.max_len - 1}",
                       param="file", code="context_length_exceeded")
    return EngineRequest({PROMPT: torch.tensor(ids, dtype=torch.long), **out.tensors}, {"media": ["audio"]}, len(ids))
