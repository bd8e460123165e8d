"""The HTTP face of qwen3tts: ``/v1/audio/speech`` and ``/v1/generate``.

Speech request fields beyond OpenAI's: ``voice`` is the speaker (default: the checkpoint's
first), ``language`` (default ``auto``), ``non_streaming_mode`` (the prompt layout, default
``true`` as in qwen-tts). Sampling: the OpenAI fields drive the first codebook; the
extension ``sampling: {"aux": {"code_predictor": {...}}}`` drives the residual codebooks
(an unknown label is a 400). Instructions and voice cloning are not implemented: 400.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar.api import SPEECH, ApiAdapter, ApiError, EngineRequest, Voice
from mstar.api.protocol import SpeechRequest

from mstar_qwen3tts.config import Qwen3TTSConfig
from mstar_qwen3tts.prompt import PromptError, assistant_text, build_prompt

# Request fields of features this plugin does not implement, with the feature's name.
_UNSUPPORTED = {
    "instructions": "instruct (speaking-style instructions)",
    "instruct": "instruct (speaking-style instructions)",
    "ref_audio": "voice clone",
    "ref_text": "voice clone",
    "voice_clone_prompt": "voice clone",
    "x_vector_only_mode": "voice clone",
}


class Qwen3TTSApiAdapter(ApiAdapter):
    endpoints = frozenset({SPEECH})
    audio_signal = "audio"
    sampling_node = "talker"

    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.cfg = Qwen3TTSConfig.from_dict(config)
        self.sample_rate = self.cfg.codec.sample_rate
        self.checkpoint_dir = checkpoint_dir
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The preprocess pool pickles the adapter; each worker loads its own tokenizer.
        return {**self.__dict__, "_tokenizer": None}

    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer is None:
            from mstar_qwen3tts.text_tokenizer import load_tokenizer

            if self.checkpoint_dir is None:
                raise ApiError(500, "the qwen3tts adapter has no checkpoint directory to read its tokenizer from")
            self._tokenizer = load_tokenizer(self.checkpoint_dir)
        from mstar_qwen3tts.text_tokenizer import encode

        return encode(self._tokenizer, text)

    def voices(self) -> list[Voice]:
        """The checkpoint's speakers (``spk_id``), each with the languages a request may name;
        a dialect speaker speaks its dialect for Chinese and ``auto``."""
        languages = tuple(self.cfg.languages)
        dialects = self.cfg.talker.spk_is_dialect or {}
        return [
            Voice(name, languages, f"dialect: {dialects[name]}" if dialects.get(name) else None)
            for name in self.cfg.speakers
        ]

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        extra = dict(request.model_extra or {})
        if request.instructions:
            extra["instructions"] = request.instructions
        for name, feature in _UNSUPPORTED.items():
            if extra.get(name) not in (None, "", False):
                raise ApiError(400, f"{feature} is not implemented by qwen3tts (field {name!r})", param=name, code="not_implemented")
        if request.speed != 1.0:
            raise ApiError(400, "speed control is not implemented by qwen3tts; omit speed or use 1.0", param="speed", code="not_implemented")
        language = extra.get("language", "auto")
        layout = extra.get("non_streaming_mode", True)
        if not isinstance(language, str):
            raise ApiError(400, "language must be a string", param="language")
        if not isinstance(layout, bool):
            raise ApiError(400, "non_streaming_mode must be a boolean", param="non_streaming_mode")
        speaker = request.voice or self.cfg.speakers[0]
        try:
            prompt = build_prompt(self.cfg, self.tokenize(assistant_text(request.input)), speaker, language, layout)
        except PromptError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return EngineRequest(prompt.inputs(), prompt_tokens=len(prompt.text_ids))

    def warmup_request(self) -> SpeechRequest:
        return SpeechRequest(model="", input="Hi", voice=self.cfg.speakers[0], max_tokens=2, temperature=0)
