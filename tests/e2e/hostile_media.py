"""Small files that decode to a lot of memory, for the media-limit tests: an mp4 of blank
720p frames (a few KB for hundreds of frames) and a blank PNG of 6000x6000 pixels (a few KB)."""

from __future__ import annotations

import base64
import io


def blank_mp4(frames: int, width: int = 1280, height: int = 720, rate: int = 2) -> bytes:
    """``frames`` identical frames at ``rate`` fps in H.264 (every frame is sampled at 2 fps)."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "51", "preset": "ultrafast"}
        image = np.zeros((height, width, 3), np.uint8)
        for _ in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def blank_png(side: int = 6000) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _chunk(kind: bytes, data: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB pixels and whose one IDAT holds
    a single row: the declared size alone would take width * height * 3 bytes to decode."""
    import struct
    import zlib

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" + b"\x00" * 3 * min(width, 1024))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", row) + _chunk(b"IEND", b"")


def declared_wav(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV whose header declares ``seconds`` of audio and which holds 1,600 samples."""
    import struct

    declared = int(seconds * rate) * 2 * channels
    held = b"\x00\x00" * channels * 1600
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    return (b"RIFF" + struct.pack("<I", min(declared + 36, 0xFFFFFFFF)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", min(declared, 0xFFFFFFFF)) + held)
