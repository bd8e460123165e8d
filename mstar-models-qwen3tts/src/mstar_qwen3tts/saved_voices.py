"""Saved voices of Base (voice clone) checkpoints: ``POST /v1/audio/voices`` stores a clip's
clone prompt (``ClonePrompt.tensors()``: ``speaker_embed``, ``ref_codes``, ``ref_text_ids``),
computed by the engine's encoder nodes (``voice_tensors`` returns that engine request),
and a speech request naming the voice is spoken from it, as if the clip were sent inline as
``ref_audio`` (+ ``ref_text``).

Upload fields: ``transcript`` is qwen-tts's ``ref_text``; the one option is
``x_vector_only_mode`` (true/false; default: true when no transcript is given, since
in-context cloning needs one).
"""

from __future__ import annotations

from typing import Any

from mstar.api import ApiError, EngineRequest
from mstar.api.protocol import SpeechRequest
from mstar.api.voices import EngineVoice, SavedVoice, VoiceSample

from mstar_qwen3tts.clone_prompt import ClonePrompt

OPTIONS = ("x_vector_only_mode",)
# The clone path names request fields; an upload names them differently.
_UPLOAD_FIELD = {"ref_audio": "audio", "ref_text": "transcript"}


def _flag(value: Any, name: str) -> bool:
    """A boolean from JSON (true/false) or a form field ("true"/"false"/"1"/"0")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise ApiError(400, f"{name}: true or false expected, got {value!r}", param=name)


class SavedVoices:
    """The ``ApiAdapter`` saved-voice methods of ``Qwen3TTSApiAdapter`` (which provides
    ``clone_prompt`` and ``speech_inputs_for_clone``)."""

    def voice_tensors(self, sample: VoiceSample) -> EngineVoice:
        unknown = sorted(set(sample.options) - set(OPTIONS))
        if unknown:
            raise ApiError(400, f"{unknown[0]}: not an option of qwen3tts voices (options: {', '.join(OPTIONS)})", param=unknown[0])
        xvec = sample.options.get("x_vector_only_mode")
        x_vector_only = sample.transcript is None if xvec is None else _flag(xvec, "x_vector_only_mode")
        try:
            return self.clone_voice(sample.audio, sample.sample_rate, sample.transcript, x_vector_only)  # type: ignore[attr-defined]
        except ApiError as exc:
            param = _UPLOAD_FIELD.get(exc.param or "", exc.param)
            raise ApiError(exc.status, exc.message, param=param, code=exc.code) from None

    def speech_inputs_with_voice(self, request: SpeechRequest, voice: SavedVoice) -> EngineRequest:
        extra = request.model_extra or {}
        for name in ("ref_audio", "ref_text", "x_vector_only_mode"):
            if extra.get(name) not in (None, "", False):
                raise ApiError(400, f"{name}: the saved voice {voice.name!r} is the reference already; send one or the other", param=name)
        return self.speech_inputs_for_clone(request, ClonePrompt.from_tensors(voice.tensors))  # type: ignore[attr-defined]
