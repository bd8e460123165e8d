"""The HTTP face of qwen3tts: ``/v1/audio/speech`` and ``/v1/generate``.

Speech request fields beyond OpenAI's: ``language`` (default ``auto``), ``non_streaming_mode``
(the prompt layout, default ``true`` as in qwen-tts), and per checkpoint kind:

* CustomVoice: ``voice`` is the speaker (default: the checkpoint's first); ``instructions``
  (OpenAI's field) is the style instruction on 1.7B (0.6B: 400, as qwen-tts ignores it there).
* VoiceDesign: ``instructions`` describes the voice; ``voice`` is a 400.
* Base (voice clone): ``ref_audio`` (base64 of an audio file, or a ``data:audio/...;base64,``
  URL), ``ref_text`` (its transcript, required unless ``x_vector_only_mode`` is true;
  default false as in qwen-tts). ``instructions`` is a 400. The pool sends the clip's
  features (``reference_features``); the engine's encoder nodes encode them. Saved voices
  and WS session voices are made by those nodes too, in a request of their own
  (``clone_voice``: an ``EngineVoice``).

Sampling: the OpenAI fields drive the first codebook; the extension ``sampling: {"aux":
{"code_predictor": {...}}}`` drives the residual codebooks (an unknown label is a 400).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

import torch
from mstar.api import SPEECH, ApiAdapter, ApiError, EngineRequest, Voice
from mstar.api.protocol import SpeechRequest
from mstar.api.voices import EngineVoice, SessionVoice

from mstar_qwen3tts.clone_kwargs import CLONE_ENCODE, ENCODE_ONLY, IN_CONTEXT, X_VECTOR_ONLY
from mstar_qwen3tts.clone_prompt import CloneError, ClonePrompt, read_audio
from mstar_qwen3tts.config import BASE, CUSTOM_VOICE, VOICE_DESIGN, Qwen3TTSConfig
from mstar_qwen3tts.prompt import (
    PromptError,
    SpeechPrompt,
    assistant_text,
    build_clone_prompt,
    build_prompt,
    clone_prompt_layout,
    instruct_text,
)
from mstar_qwen3tts.saved_voices import SavedVoices

CLONE_FIELDS = ("ref_audio", "ref_text", "x_vector_only_mode")
MAX_REF_AUDIO_BYTES = 20 * 1024 * 1024  # of the decoded base64
MAX_REF_AUDIO_SECONDS = 60.0
# Request fields of features this plugin does not implement, with the feature's name.
_UNSUPPORTED = {
    "voice_clone_prompt": "voice_clone_prompt (pass ref_audio, or a saved voice)",
    "instruct": "the field 'instruct' (use OpenAI's 'instructions')",
}


class Qwen3TTSApiAdapter(SavedVoices, ApiAdapter):
    endpoints = frozenset({SPEECH})
    audio_signal = "audio"
    sampling_node = "talker"

    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.config = config
        self.cfg = Qwen3TTSConfig.from_dict(config)
        self.sample_rate = self.cfg.codec.sample_rate
        self.checkpoint_dir = checkpoint_dir
        self._tokenizer: Any = None
        self.creates_voices = self.cfg.tts_model_type == BASE  # saved voices: mstar_qwen3tts.saved_voices

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

    def clone_voice(self, wave: Any, sample_rate: int, ref_text: str | None, x_vector_only_mode: bool) -> EngineVoice:
        """A reference clip (float32 mono numpy at ``sample_rate``) → the engine request that
        computes its clone prompt (what a saved voice stores: ``ClonePrompt.tensors()``) on
        the encoder nodes; bad input is a 400 naming the field."""
        if self.cfg.tts_model_type != BASE:
            raise ApiError(400, f"voice cloning needs a Base checkpoint; this one is {self.cfg.tts_model_type}", param="ref_audio")
        feats, ref_ids, _, clip_inputs, kwargs = self._clip_features(wave, sample_rate, ref_text, x_vector_only_mode)
        empty = torch.zeros(0, dtype=torch.long)  # no prompt: the talker does not run
        inputs = {"text_ids": empty, "codec_ids": empty, "trailing_ids": empty, **clip_inputs}
        tensors = {"ref_text_ids": torch.tensor(ref_ids, dtype=torch.long)}
        if feats.wave is None:
            tensors["ref_codes"] = inputs.pop("ref_codes")
        outputs = ("speaker_embed",) if feats.wave is None else ("speaker_embed", "ref_codes")
        return EngineVoice(inputs, {**kwargs, ENCODE_ONLY: True}, outputs, tensors)

    def _clip_features(self, wave: Any, rate: int, ref_text: str | None, xvec: bool) -> tuple[Any, list[int], int, dict, dict]:
        """(features, transcript ids, reference frames, the clip's engine inputs, kwargs)."""
        from mstar_qwen3tts.clone_loading import codec_encoder_rates, reference_frames
        from mstar_qwen3tts.clone_prompt import reference_features, transcript_ids
        from mstar_qwen3tts.encoder_nodes import REF_MEL, REF_WAVE

        codec_rate, _ = codec_encoder_rates(self.config)
        try:
            feats = reference_features(wave, rate, self.cfg.speaker_encoder.sample_rate, codec_rate, ref_text, xvec)
            ref_ids = [] if xvec else transcript_ids(self.tokenize, ref_text or "")
        except CloneError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        inputs: dict[str, torch.Tensor] = {REF_MEL: feats.mel}
        if feats.wave is None:
            frames = 0
            inputs["ref_codes"] = torch.zeros(0, self.cfg.talker.num_code_groups, dtype=torch.long)
        else:
            frames = reference_frames(self.config, feats.wave.numel())
            inputs[REF_WAVE] = feats.wave
        return feats, ref_ids, frames, inputs, {CLONE_ENCODE: X_VECTOR_ONLY if xvec else IN_CONTEXT}

    def speech_inputs_for_clone(self, request: SpeechRequest, clone: ClonePrompt) -> EngineRequest:
        """A speech request spoken in a cloned voice (Base checkpoints)."""
        language, layout = self._common_fields(request)
        if request.instructions:
            raise ApiError(400, "a Base (voice clone) checkpoint takes no instructions", param="instructions")
        try:
            prompt = build_clone_prompt(self.cfg, self.tokenize(assistant_text(request.input)), clone.speaker_embed,
                                        clone.ref_codes, clone.ref_text_ids.tolist(), language, layout)
        except PromptError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return self._engine_request(prompt)

    def _common_fields(self, request: SpeechRequest) -> tuple[str, bool]:
        extra = dict(request.model_extra or {})
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
        return language, layout

    def _engine_request(self, prompt: SpeechPrompt) -> EngineRequest:
        return EngineRequest(prompt.inputs(), prompt_tokens=len(prompt.text_ids))

    def _clip_from_request(self, request: SpeechRequest) -> tuple[Any, int, str | None, bool]:
        """(samples, rate, ref_text, x_vector_only_mode) of a request's inline clip."""
        extra = dict(request.model_extra or {})
        ref_audio, ref_text, xvec = extra.get("ref_audio"), extra.get("ref_text"), extra.get("x_vector_only_mode", False)
        if not isinstance(xvec, bool):
            raise ApiError(400, "x_vector_only_mode must be a boolean", param="x_vector_only_mode")
        if ref_text is not None and not isinstance(ref_text, str):
            raise ApiError(400, "ref_text must be a string", param="ref_text")
        if not ref_audio:
            raise ApiError(400, "a Base (voice clone) checkpoint needs ref_audio: base64 audio or a data:audio/...;base64, URL",
                           param="ref_audio")
        if not isinstance(ref_audio, str):
            raise ApiError(400, "ref_audio must be a string (base64 or a data URL)", param="ref_audio")
        try:
            wave, rate = read_audio(_decode_base64_audio(ref_audio), MAX_REF_AUDIO_SECONDS)
        except CloneError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return wave, rate, ref_text, xvec

    def session_voice(self, request: SpeechRequest) -> SessionVoice | None:
        """A speech session's inline clip as a voice, made once (on the encoder nodes, as a
        saved voice is) for all the session's sentences; None without ``ref_audio``."""
        if self.cfg.tts_model_type != BASE or not (request.model_extra or {}).get("ref_audio"):
            return None
        return SessionVoice(self.clone_voice(*self._clip_from_request(request)), CLONE_FIELDS)

    def _encoded_clone_request(self, request: SpeechRequest) -> EngineRequest:
        """A request with its clip inline: the pool resamples it and computes its log-mel
        features; the engine's encoder nodes compute the clone prompt (batched with other
        requests' clips) before the talker's prefill."""
        language, layout = self._common_fields(request)
        _, ref_ids, frames, clip_inputs, kwargs = self._clip_features(*self._clip_from_request(request))
        try:
            prompt = clone_prompt_layout(self.cfg, self.tokenize(assistant_text(request.input)), frames, ref_ids, language, layout)
        except PromptError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return EngineRequest({**prompt.inputs(), **clip_inputs}, kwargs, prompt_tokens=len(prompt.text_ids))

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
        kind = self.cfg.tts_model_type
        if kind == BASE:
            if request.voice:
                raise ApiError(400, f"unknown voice {request.voice!r}: a Base checkpoint clones the voice of ref_audio",
                               param="voice")
            if request.instructions:
                raise ApiError(400, "a Base (voice clone) checkpoint takes no instructions", param="instructions")
            return self._encoded_clone_request(request)
        language, layout = self._common_fields(request)
        for name in CLONE_FIELDS:
            if extra.get(name) not in (None, "", False):
                raise ApiError(400, f"{name}: voice cloning needs a Base checkpoint; this one is {kind}", param=name)
        instruct_ids = None
        if request.instructions:
            if not self.cfg.supports_instructions:
                raise ApiError(400, "this checkpoint (CustomVoice 0.6B) takes no instructions", param="instructions")
            instruct_ids = self.tokenize(instruct_text(request.instructions))
        if kind == VOICE_DESIGN and request.voice:
            raise ApiError(400, "a VoiceDesign checkpoint has no named voices: describe the voice in instructions", param="voice")
        speaker = (request.voice or self.cfg.speakers[0]) if kind == CUSTOM_VOICE else None
        try:
            prompt = build_prompt(self.cfg, self.tokenize(assistant_text(request.input)), speaker, language, layout, instruct_ids)
        except PromptError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return self._engine_request(prompt)

    def warmup_request(self) -> SpeechRequest:
        # Frames for a first chunk, a whole chunk and a shorter last one: each of the codec's
        # chunk shapes is met (compile_regions compiles each on its first call).
        s = self.cfg.streaming
        frames = s.first_chunk + s.chunk + s.chunk // 2 + 1
        fields: dict[str, Any] = {"model": "", "input": "Hi", "max_tokens": frames, "min_tokens": frames, "temperature": 0}
        if self.cfg.tts_model_type == CUSTOM_VOICE:
            fields["voice"] = self.cfg.speakers[0]
        elif self.cfg.tts_model_type == VOICE_DESIGN:
            fields["instructions"] = "A calm voice."
        else:
            fields |= {"ref_audio": base64.b64encode(_tone_wav()).decode(), "x_vector_only_mode": True}
        return SpeechRequest.model_validate(fields)


def _decode_base64_audio(text: str) -> bytes:
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if not head.endswith(";base64"):
            raise ApiError(400, "ref_audio: a data URL must be base64 (data:audio/...;base64,...)", param="ref_audio")
    if len(text) * 3 // 4 > MAX_REF_AUDIO_BYTES:
        raise ApiError(400, f"ref_audio is over the limit of {MAX_REF_AUDIO_BYTES} bytes", param="ref_audio")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "ref_audio is not valid base64", param="ref_audio") from None


def _tone_wav(seconds: float = 0.5, rate: int = 24000) -> bytes:
    """A short sine tone as WAV bytes (the Base checkpoint's warm-up reference clip)."""
    import io

    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()
