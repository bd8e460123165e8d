"""Reading uploaded audio without letting a small file decode to a lot of memory.

A few KB of FLAC can declare eight channels at 655 kHz for hours: ``soundfile.read`` would
decode all of it, every channel, in float32. ``read_mono`` checks the header first (the
duration and the sample rate it declares), then decodes in blocks, averaging the channels
block by block (the same values as averaging the whole array), and stops as soon as the
samples decoded pass the duration (for headers that state no length, e.g. some MP3s).
At most ``max_seconds * rate`` mono float32 samples are ever held, with ``rate`` at most
``MAX_SOURCE_RATE``.

    wave, rate = read_mono(data, max_seconds=30.0)    # float32 mono at the file's own rate

Errors are ``AudioInputError`` (a ``ValueError``) with ``code`` ``audio_too_long``,
``audio_rate_too_high`` or ``invalid_audio``.
"""

from __future__ import annotations

import io

import numpy as np

MAX_SOURCE_RATE = 192_000  # Hz: higher declared rates are refused before decoding
_BLOCK = 1 << 16  # frames per block


class AudioInputError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def read_mono(data: bytes, max_seconds: float, max_rate: int = MAX_SOURCE_RATE) -> tuple[np.ndarray, int]:
    """Audio libsndfile reads (WAV, FLAC, OGG, MP3) -> (float32 mono, its sample rate)."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioInputError(f"not readable audio (WAV, FLAC, OGG or MP3): {exc}", "invalid_audio") from None
    rate = int(info.samplerate)
    if rate <= 0 or info.channels <= 0:
        raise AudioInputError(f"not readable audio: {rate} Hz, {info.channels} channels", "invalid_audio")
    if rate > max_rate:
        raise AudioInputError(f"the audio is sampled at {rate} Hz; at most {max_rate} Hz is accepted", "audio_rate_too_high")
    if info.frames > 0 and info.frames / rate > max_seconds:
        raise AudioInputError(f"the audio lasts {info.frames / rate:.1f} s; at most {max_seconds:g} s is accepted", "audio_too_long")
    limit = int(max_seconds * rate) if np.isfinite(max_seconds) else None
    chunks: list[np.ndarray] = []
    frames = 0
    try:
        for block in sf.blocks(io.BytesIO(data), blocksize=_BLOCK, dtype="float32", always_2d=True):
            frames += block.shape[0]
            if limit is not None and frames > limit:  # the header did not state the length, or understated it
                raise AudioInputError(f"the audio lasts more than {max_seconds:g} s; at most {max_seconds:g} s is accepted",
                                      "audio_too_long")
            chunks.append(block.mean(axis=1))
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioInputError(f"not readable audio (WAV, FLAC, OGG or MP3): {exc}", "invalid_audio") from None
    wave = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    return wave, rate
