"""Orpheus over HTTP: ``/v1/audio/speech`` (text + voice -> 24 kHz audio) and the native
``/v1/generate`` (``prompt_ids`` in; ``token``, ``audio`` and, on request, ``logits`` out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar.api import SPEECH, ApiAdapter, ApiError, EngineRequest, Voice
from mstar.api.protocol import SpeechRequest

from mstar_orpheus.prompt import DEFAULT_VOICE, VOICES, SpeechPrompt


class OrpheusApiAdapter(ApiAdapter):
    endpoints = frozenset({SPEECH})
    audio_signal = "audio"
    sampling_node = "lm"

    def __init__(self, config: dict[str, Any], checkpoint_dir: Path) -> None:
        self.sample_rate = int(config["snac"].get("sampling_rate", 24000))
        self.prompt = SpeechPrompt.from_config(config, checkpoint_dir)

    def voices(self) -> list[Voice]:
        # The finetuned checkpoint's speakers; it declares no languages. Default first.
        return [Voice(name) for name in (DEFAULT_VOICE, *(v for v in VOICES if v != DEFAULT_VOICE))]

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        if request.speed != 1.0:
            raise ApiError(400, f"speed {request.speed} is not supported: Orpheus speaks at speed 1.0 only", param="speed")
        if request.instructions:
            raise ApiError(400, "Orpheus takes no instructions; put emotion tags such as <laugh> in the input", param="instructions")
        if request.voice is not None and request.voice not in VOICES:
            raise ApiError(400, f"unknown voice {request.voice!r}; Orpheus voices: {', '.join(VOICES)}",
                           param="voice", code="unknown_voice")
        try:
            ids = self.prompt.encode(request.input, request.voice)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="input") from None
        return EngineRequest({"prompt_ids": ids}, prompt_tokens=int(ids.numel()))

    def warmup_request(self) -> SpeechRequest:
        # Long enough for one SNAC window, so the decoder warms up too.
        return SpeechRequest(model="", input="Hi", voice="tara", max_tokens=36, temperature=0)
