"""Audio containers for responses: WAV, FLAC (soundfile) and raw 16-bit PCM."""

from __future__ import annotations

import io
import struct

import numpy as np


def to_pcm16(samples: np.ndarray) -> bytes:
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole clip in ``fmt`` ("wav", "flac", "pcm"/"pcm16")."""
    if fmt in ("pcm", "pcm16"):
        return to_pcm16(samples)
    import soundfile as sf

    buf = io.BytesIO()
    # The same 16-bit samples as "pcm": libsndfile's own float conversion scales negative
    # samples by 32768 and rounds, so a WAV would differ from the PCM of one request.
    audio = np.frombuffer(to_pcm16(samples), dtype="<i2")
    sf.write(buf, audio, sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum, as is usual
    for streamed WAV; players read until the connection ends)."""
    byte_rate = sample_rate * channels * bits // 8
    unknown = 0xFFFFFFFF
    return (
        b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, byte_rate, channels * bits // 8, bits)
        + b"data" + struct.pack("<I", unknown)
    )


MEDIA_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/pcm", "pcm16": "audio/pcm"}
