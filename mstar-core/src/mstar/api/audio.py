"""Audio containers for responses: WAV, FLAC, MP3 and Ogg Opus (soundfile / libsndfile) and
raw 16-bit PCM. Every container holds the same 16-bit samples as ``pcm``."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

# Format name -> (libsndfile container, subtype); "pcm" / "pcm16" are raw little-endian.
_CONTAINERS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
#: The sample rates an Opus stream can carry (libopus).
OPUS_SAMPLE_RATES = (8000, 12000, 16000, 24000, 48000)
#: ``audio.format`` values of chat completions, in OpenAI's names (``pcm`` is an alias of
#: ``pcm16``). OpenAI's ``aac`` is not among them: libsndfile has no AAC encoder.
CHAT_AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "pcm16")


def to_pcm16(samples: np.ndarray) -> bytes:
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


def format_problem(fmt: str, sample_rate: int, formats: tuple[str, ...] = CHAT_AUDIO_FORMATS) -> str | None:
    """Why ``fmt`` cannot hold audio at ``sample_rate`` (a message for a 400), or None."""
    if fmt == "pcm" and "pcm16" in formats:
        return None
    if fmt not in formats:
        return f"audio format {fmt!r} is not supported; supported: {', '.join(formats)}"
    if fmt == "opus" and sample_rate not in OPUS_SAMPLE_RATES:
        return f"opus cannot carry this model's {sample_rate} Hz audio (Opus rates: {', '.join(map(str, OPUS_SAMPLE_RATES))}); use another format"
    return None


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole clip in ``fmt`` ("wav", "flac", "mp3", "opus", "pcm"/"pcm16")."""
    if fmt in ("pcm", "pcm16"):
        return to_pcm16(samples)
    import soundfile as sf

    container, subtype = _CONTAINERS[fmt]
    buf = io.BytesIO()
    # The same 16-bit samples as "pcm": libsndfile's own float conversion scales negative
    # samples by 32768 and rounds, so a WAV would differ from the PCM of one request.
    audio = np.frombuffer(to_pcm16(samples), dtype="<i2")
    sf.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return _fixed_ogg_serial(buf.getvalue()) if container == "OGG" else buf.getvalue()


_BIT_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
_OGG_SERIAL = 1


def _ogg_crc(page: bytes) -> int:
    """Ogg's page checksum (CRC-32, polynomial 0x04C11DB7, MSB first, no init or final
    xor), through zlib's bit-reflected CRC-32 on bit-reversed bytes."""
    reflected = zlib.crc32(page.translate(_BIT_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def _fixed_ogg_serial(data: bytes) -> bytes:
    """``data`` with one fixed stream serial number: libsndfile draws a random one per
    file, so the same samples would give different bytes (a seeded request must not)."""
    out = bytearray(data)
    at = 0
    while at + 27 <= len(out) and out[at : at + 4] == b"OggS":
        segments = out[at + 26]
        size = 27 + segments + sum(out[at + 27 : at + 27 + segments])
        out[at + 14 : at + 18] = struct.pack("<I", _OGG_SERIAL)
        out[at + 22 : at + 26] = b"\0\0\0\0"
        out[at + 22 : at + 26] = struct.pack("<I", _ogg_crc(bytes(out[at : at + size])))
        at += size
    return bytes(out)


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


MEDIA_TYPES = {
    "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
    "pcm": "audio/pcm", "pcm16": "audio/pcm",
}
