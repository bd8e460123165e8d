"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: the request (OpenAI's
multipart fields) and the response bodies of each ``response_format``.

The uploaded bytes cross into the preprocess pool as they are and are decoded there (never in
the API process's event loop): ``TranscriptionRequest.decoded()`` gives the adapter's
``transcription_inputs`` the audio as mono float32 at the file's own sample rate (resampling
to what the model needs is the adapter's job, as for saved voices). Unreadable, empty or too
long audio is a 400 naming ``file``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field

from mstar.api.errors import ApiError
from mstar.api.protocol import _SamplingFields

TRANSCRIBE, TRANSLATE = "transcribe", "translate"
ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]
#: What each ``response_format`` is sent as.
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
               "srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}
STREAMABLE = ("json", "text")  # as OpenAI: the other formats need the whole text first


class TranscriptionRequest(_SamplingFields):
    """One transcription (``task`` ``transcribe``) or translation into English
    (``translate``). ``file`` holds the upload's bytes; ``audio`` and ``sample_rate`` are set
    by ``decoded()`` in the preprocess pool. Besides OpenAI's fields, the sampling fields of
    the other endpoints (``seed``, ``top_p``, ...) and ``max_tokens`` are read."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    model: str
    task: Literal["transcribe", "translate"] = TRANSCRIBE
    file: bytes = Field(repr=False)
    filename: str | None = None
    language: str | None = None  # ISO-639-1, e.g. "en" (transcriptions only)
    prompt: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # OpenAI's range
    response_format: ResponseFormat = "json"
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)  # an M* extension: OpenAI's API has no such field
    max_seconds: float = 600.0  # set by the route from the adapter's ``max_audio_seconds``
    audio: Any = Field(None, repr=False)
    sample_rate: int = 0

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate if self.sample_rate else 0.0

    def decoded(self) -> TranscriptionRequest:
        """This request with ``audio`` (mono float32 ``[samples]`` in [-1, 1]) and
        ``sample_rate`` set; a 400 naming ``file`` for bytes that are no readable audio
        (WAV, FLAC, OGG, MP3), hold no samples, or last longer than ``max_seconds``."""
        from mstar.api.audio_input import AudioInputError, read_mono

        try:
            samples, rate = read_mono(self.file, self.max_seconds)
        except AudioInputError as exc:
            raise ApiError(400, f"file: {exc}", param="file", code=exc.code) from None
        if samples.shape[0] == 0:
            raise ApiError(400, "file: the audio holds no samples", param="file", code="invalid_audio")
        return self.model_copy(update={"audio": np.ascontiguousarray(samples, dtype=np.float32), "sample_rate": int(rate)})


def _timestamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def response_body(req: TranscriptionRequest, text: str, duration_s: float, usage: dict[str, Any]) -> dict[str, Any] | str:
    """The whole response in ``req.response_format``: a JSON object (``json``,
    ``verbose_json``) or text. The model gives no timestamps, so ``verbose_json``, ``srt`` and
    ``vtt`` hold one segment spanning the whole audio."""
    fmt = req.response_format
    if fmt == "json":
        return {"text": text, "usage": usage}
    if fmt == "text":
        return text
    if fmt == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": duration_s, "text": text, "tokens": [],
                   "temperature": req.temperature or 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
        return {"task": req.task, "language": req.language or "", "duration": duration_s, "text": text,
                "segments": [segment] if text else [], "usage": usage}
    if not text:
        return "WEBVTT\n\n" if fmt == "vtt" else ""
    if fmt == "srt":
        return f"1\n{_timestamp(0, ',')} --> {_timestamp(duration_s, ',')}\n{text.strip()}\n\n"
    return f"WEBVTT\n\n{_timestamp(0, '.')} --> {_timestamp(duration_s, '.')}\n{text.strip()}\n\n"
