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
