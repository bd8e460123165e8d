"""V-JEPA 2 video input is bounded in decoded pixels (``MSTAR_MAX_MEDIA_PIXELS``): a 6 KB mp4
of 64 blank 720p frames is refused from what its container declares, before decoding; with
``num_frames`` only the sampled frames are kept (the same frames as decoding all and sampling);
a list of 4 KB PNGs of 6000x6000 is refused from their headers."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from mstar_vjepa2.video import decode_images, decode_video, sample_indices

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from hostile_media import blank_mp4, blank_png  # noqa: E402


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_video_declaring_too_many_pixels_is_refused_before_decoding():
    data = blank_mp4(64)

    def refused() -> None:
        with pytest.raises(ValueError, match=r"64 frames of 1280x720 .*MSTAR_MAX_MEDIA_PIXELS"):
            decode_video(data, max_frames=1024, max_pixels=40_000_000)

    assert _peak(refused) < 4 << 20


def test_sampled_frames_are_the_only_ones_kept_and_equal_sampling_all():
    import av
    import numpy as np

    buf = __import__("io").BytesIO()
    with av.open(buf, "w", format="mp4") as out:  # 12 frames that differ
        stream = out.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(12):
            image = np.full((48, 64, 3), i * 20, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    data = buf.getvalue()
    everything = decode_video(data, max_frames=1024)
    sampled = decode_video(data, max_frames=1024, num_frames=4, max_pixels=4 * 64 * 48)
    assert torch.equal(sampled, everything[torch.from_numpy(sample_indices(12, 4))])
    with pytest.raises(ValueError, match="MSTAR_MAX_MEDIA_PIXELS"):
        decode_video(data, max_frames=1024, num_frames=5, max_pixels=4 * 64 * 48)
    big = blank_mp4(64)  # 720p, but 2 sampled frames fit
    assert decode_video(big, max_frames=1024, num_frames=2, max_pixels=2 * 1280 * 720).shape == (2, 720, 1280, 3)


def test_images_are_refused_from_their_headers():
    png = blank_png(6000)

    def refused() -> None:
        with pytest.raises(ValueError, match=r"images\[1\]: .*MSTAR_MAX_MEDIA_PIXELS"):
            decode_images([png, png], max_pixels=40_000_000)

    assert _peak(refused) < 4 << 20
