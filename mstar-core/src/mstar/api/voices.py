"""Saved voices on the adapter's side: the reference clip a voice is made from, and a stored
voice as a speech request uses it (``ApiAdapter.voice_tensors`` / ``speech_inputs_with_voice``).

``VoiceUpload`` crosses into the preprocess pool as the uploaded bytes; it is decoded there
(never in the API process's event loop) into a ``VoiceSample``, mono float32 at the file's
own sample rate: resampling to what the model needs is the adapter's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mstar.api.errors import ApiError


@dataclass(frozen=True)
class VoiceSample:
    """A decoded reference clip: ``audio`` is mono float32 in [-1, 1], ``[samples]``."""

    audio: np.ndarray
    sample_rate: int
    transcript: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # the upload's other fields (model-specific)

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


@dataclass(frozen=True)
class VoiceUpload:
    """The bytes of an uploaded reference clip (any container libsndfile reads: WAV, FLAC,
    OGG, MP3), with the limit its decoded duration must respect."""

    data: bytes
    transcript: str | None = None
    max_seconds: float = 30.0
    options: dict[str, Any] = field(default_factory=dict)

    def decode(self) -> VoiceSample:
        """Errors are 400s naming the ``audio`` field: unreadable bytes, an empty clip, one
        longer than ``max_seconds`` or sampled above ``MAX_SOURCE_RATE`` (both checked from
        the header, before decoding; the length again while decoding, in blocks)."""
        from mstar.api.audio_input import AudioInputError, read_mono

        try:
            samples, rate = read_mono(self.data, self.max_seconds)
        except AudioInputError as exc:
            raise ApiError(400, f"audio: {exc}", param="audio", code=exc.code) from None
        if samples.shape[0] == 0:
            raise ApiError(400, "audio: the clip holds no samples", param="audio", code="invalid_audio")
        return VoiceSample(np.ascontiguousarray(samples, dtype=np.float32), int(rate), self.transcript, dict(self.options))


@dataclass(frozen=True)
class SavedVoice:
    """A voice from the library: the tensors ``ApiAdapter.voice_tensors`` chose to store
    when it was made, and the reference clip's transcript (if one was given)."""

    name: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    transcript: str | None = None


@dataclass(frozen=True)
class EngineVoice:
    """A voice whose tensors the engines compute (e.g. a model's encoder nodes): what
    ``ApiAdapter.voice_tensors`` / ``session_voice`` may return instead of the tensors. The
    server runs one engine request (``inputs``, ``kwargs``) and stores, beside ``tensors``
    (computed in the pool), the one value of each output signal in ``outputs``."""

    inputs: dict[str, torch.Tensor]
    kwargs: dict[str, Any]
    outputs: tuple[str, ...]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionVoice:
    """A voice a speech session's settings carry inline (e.g. a reference clip), made once
    for the session by ``ApiAdapter.session_voice``: each of its sentences is spoken with
    ``voice`` (through ``speech_inputs_with_voice``; an ``EngineVoice`` is computed by the
    engines first), its settings without ``fields`` (those that made the voice)."""

    voice: SavedVoice | EngineVoice
    fields: tuple[str, ...] = ()
