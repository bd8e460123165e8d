"""The API adapter: ``/v1/chat/completions`` (and ``/v1/completions``) on the checkpoint's
tokenizer and chat template, with OpenAI content parts ``text``, ``image_url``,
``input_audio``, ``audio_url`` and ``video_url`` through transformers' Qwen3-Omni processor
(``processing.Preprocessor``). A media part that cannot be used is a 400 naming it.

Speech out, for checkpoints with a Talker (``talker_config.speaker_id`` lists its voices):

- chat with ``modalities: ["text", "audio"]`` and ``audio: {"voice", "format"}`` sets the
  engine kwargs ``modalities`` and ``voice`` (the plugin docstring has the graph); voices are
  the checkpoint's speakers, matched case-insensitively, ``Ethan`` (when listed) first and the
  default; any other is a 400 listing them. Text is the ``tokens`` signal, audio the
  ``audio`` signal (24 kHz).
- ``/v1/audio/speech`` speaks ``input`` through the Thinker, whose text the Talker voices:
  the prompt is the chat template over a system message (``SPEECH_SYSTEM_PROMPT``, asking for
  the user's text read aloud word for word) and ``input`` as the user message. The checkpoint
  has no prompt format that forces its text, so what is spoken is what the Thinker answers
  (with released weights: the input). ``instructions`` and ``speed`` other than 1 are a 400.
- ``/v1/audio/transcriptions`` and ``/translations`` (checkpoints with an audio encoder): the
  Thinker answers a chat of the audio and an instruction, in text (``adapter_transcription``).
- Sampling: OpenAI's fields drive the Thinker; ``sampling.nodes.talker`` (main fields and
  ``aux.code_predictor``) the Talker and its code predictor.

Remote media URLs are refused unless their host is listed in the environment variable
``MSTAR_ALLOWED_MEDIA_DOMAINS`` (comma-separated; a leading dot allows subdomains as
``media.py`` defines). Each request's media is bounded in total (``media.MediaLimits``):
``MSTAR_MAX_MEDIA_PIXELS`` decoded pixels over its images and sampled video frames (default
40,000,000), ``MSTAR_MAX_MEDIA_AUDIO_SECONDS`` of audio (600) and ``MSTAR_MAX_MEDIA_PARTS``
media parts (32). ``use_audio_in_video`` (or vLLM's
``mm_processor_kwargs.use_audio_in_video``) interleaves a video's audio track.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from mstar.api.adapter import (
    CHAT,
    COMPLETIONS,
    SPEECH,
    TRANSCRIPTION,
    TRANSLATION,
    EngineRequest,
    Voice,
)
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, SpeechRequest
from mstar.api.text_adapter import TextLMAdapter
from mstar.api.transcription import TranscriptionRequest
from mstar.text import chat_prompt_ids
from mstar.text.lm import PROMPT

from mstar_qwen3omni.media import MediaLimits

ALLOWED_DOMAINS_ENV = "MSTAR_ALLOWED_MEDIA_DOMAINS"
# Processor tensor -> the media kind whose encoder walk consumes it.
MEDIA_OF_TENSOR = {"input_features": "audio", "pixel_values": "image", "pixel_values_videos": "video"}
AUDIO_SIGNAL = "audio"
CODES_SIGNAL = "codes"  # the Talker's codec frames, one per step
SAMPLE_RATE = 24000  # Code2Wav's output rate
DEFAULT_VOICE = "ethan"
SPEECH_SYSTEM_PROMPT = "Read the user's message aloud exactly as written, word for word, adding nothing."


def speaker_names(config: Mapping[str, Any]) -> list[str]:
    """The checkpoint's voices as it spells them, the default (Ethan when listed) first;
    none for a checkpoint without a Talker."""
    names = [str(k) for k in ((config.get("talker_config") or {}).get("speaker_id") or {})]
    return sorted(names, key=lambda n: n.lower() != DEFAULT_VOICE)


# Per-request media limits (``media.MediaLimits``), each overridable by its environment variable.
LIMIT_ENVS = {
    "max_request_pixels": ("MSTAR_MAX_MEDIA_PIXELS", int),
    "max_request_audio_seconds": ("MSTAR_MAX_MEDIA_AUDIO_SECONDS", float),
    "max_media_parts": ("MSTAR_MAX_MEDIA_PARTS", int),
}


def limits_from_env() -> MediaLimits:
    domains = tuple(d.strip() for d in os.environ.get(ALLOWED_DOMAINS_ENV, "").split(",") if d.strip())
    overrides: dict[str, Any] = {}
    for name, (env, kind) in LIMIT_ENVS.items():
        if os.environ.get(env, "").strip():
            try:
                overrides[name] = kind(os.environ[env])
            except ValueError:
                raise ValueError(f"{env}={os.environ[env]!r} is not a number") from None
    return MediaLimits(allowed_domains=domains, **overrides)


class OmniChatAdapter(TextLMAdapter):
    def __init__(
        self, checkpoint_dir: str | Path, text_config: Mapping[str, Any], node: str, limits: MediaLimits,
        speakers: Sequence[str] = (),
        media_kinds: Sequence[str] = ("audio", "image", "video"), audio_token_id: int | None = None,
    ) -> None:
        # transformers formats this model's chats with its processor: its template files first.
        super().__init__(checkpoint_dir, text_config, node=node, template_from="processor")
        self.limits = limits
        self.media_kinds = tuple(media_kinds)  # what the checkpoint has encoders for
        self._preprocessor: Any = None
        self.speakers = tuple(speakers)
        self.audio_token_id = audio_token_id  # the prompt's audio placeholder
        if self.speakers:  # a checkpoint with a Talker speaks
            self.endpoints = frozenset({CHAT, COMPLETIONS, SPEECH})
            self.chat_audio = True
            self.audio_signal = AUDIO_SIGNAL
            self.audio_codes_signal = CODES_SIGNAL
            self.sample_rate = SAMPLE_RATE
        if "audio" in self.media_kinds:  # an audio encoder transcribes
            self.endpoints = self.endpoints | {TRANSCRIPTION, TRANSLATION}
            self.max_audio_seconds = min(limits.max_audio_seconds, limits.max_request_audio_seconds)

    def voices(self) -> list[Voice]:
        return [Voice(name) for name in self.speakers]

    def audio_voice(self, voice: str | None, param: str = "voice") -> str | None:
        """The checkpoint's spelling of ``voice`` (case-insensitive), the default for None;
        a 400 listing the voices otherwise."""
        if voice is None or not self.speakers:
            return super().audio_voice(voice, param)
        found = [name for name in self.speakers if name.lower() == voice.lower()]
        return super().audio_voice(found[0] if found else voice, param)

    def _speaking(self, req: EngineRequest, voice: str | None, param: str) -> EngineRequest:
        req.kwargs.update(modalities=["text", "audio"], voice=self.audio_voice(voice, param))
        return req

    def prompt_audio_tokens(self, request: EngineRequest) -> int | None:
        """The prompt's audio placeholders: one per audio-encoder output frame."""
        prompt = request.inputs.get(PROMPT)
        if self.audio_token_id is None or prompt is None:
            return None
        return int((prompt == self.audio_token_id).sum())

    @property
    def preprocessor(self) -> Any:
        if self._preprocessor is None:  # once per process, on the first media request
            from mstar_qwen3omni.processing import Preprocessor

            self._preprocessor = Preprocessor.from_checkpoint(self.checkpoint_dir, self.limits)
        return self._preprocessor

    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        req = self._chat_inputs(request)
        if request.wants_audio:  # the route checked that this checkpoint speaks
            return self._speaking(req, request.audio.voice_name if request.audio else None, "audio.voice")
        return req

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        if request.instructions:
            raise ApiError(400, "instructions are not implemented for qwen3omni speech", param="instructions", code="not_implemented")
        if request.speed != 1.0:
            raise ApiError(400, "speed control is not implemented for qwen3omni; omit speed or use 1.0", param="speed", code="not_implemented")
        messages = [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": request.input}]
        ids = chat_prompt_ids(self.tokenizer, messages)
        return self._speaking(self._request(ids, "input"), request.voice, "voice")

    def transcription_inputs(self, request: TranscriptionRequest) -> EngineRequest:
        from mstar_qwen3omni.adapter_transcription import transcription_inputs

        return transcription_inputs(self, request)

    def _chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        if not any(has_media(m) for m in messages):
            return super().chat_inputs(request)
        extra = request.model_extra or {}
        in_video = extra.get("use_audio_in_video", (extra.get("mm_processor_kwargs") or {}).get("use_audio_in_video", False))
        self._check_media_kinds(messages, bool(in_video))
        try:
            out = self.preprocessor(messages, use_audio_in_video=bool(in_video))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        ids = out.input_ids
        if len(ids) >= self.max_len:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this model holds at most {self.max_len - 1}",
                           param="messages", code="context_length_exceeded")
        media = [kind for key, kind in MEDIA_OF_TENSOR.items() if key in out.tensors]
        return EngineRequest({PROMPT: torch.tensor(ids, dtype=torch.long), **out.tensors}, {"media": media}, len(ids))


    def _check_media_kinds(self, messages: list[dict[str, Any]], audio_in_video: bool) -> None:
        """A 400 naming the first part whose kind this checkpoint has no encoder for."""
        for i, message in enumerate(messages):
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else ()):
                kind = PART_KINDS.get(part.get("type")) if isinstance(part, Mapping) else None
                needs = {kind, "audio"} if kind == "video" and audio_in_video else {kind}
                missing = sorted(k for k in needs if k is not None and k not in self.media_kinds)
                if missing:
                    where = f"messages[{i}].content[{j}] ({part['type']})"
                    raise ApiError(400, f"{where}: this checkpoint has no {missing[0]} encoder; it takes "
                                   f"{', '.join(self.media_kinds) or 'text only'}", param=where, code="unsupported_media")


PART_KINDS = {"image_url": "image", "video_url": "video", "input_audio": "audio", "audio_url": "audio"}


def has_media(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") != "text" for p in content)
