"""``media.MediaBudget``: one request's media is bounded in total (parts, decoded pixels over
images and sampled video frames, audio seconds), from what the files declare before they are
decoded, and while decoding."""

from __future__ import annotations

import io
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from mstar_qwen3omni.media import MediaBudget, MediaLimits, decode_audio, decode_image, decode_video

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from hostile_media import blank_mp4, blank_png  # noqa: E402


def _flac(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="FLAC")
    return buf.getvalue()


def test_audio_seconds_add_up_over_the_parts_of_a_request():
    limits = MediaLimits(max_request_audio_seconds=10.0)
    budget = MediaBudget(limits)
    for i in range(2):
        assert decode_audio(_flac(4.0), limits, f"p{i}", 16000, budget=budget).size == 64000
    with pytest.raises(ValueError, match=r"p2: .*max_request_audio_seconds"):
        decode_audio(_flac(4.0), limits, "p2", 16000, budget=budget)
    assert budget.audio_seconds == 8.0


def test_images_add_up_and_a_png_is_refused_from_its_header():
    limits = MediaLimits(max_request_pixels=40_000_000)
    budget = MediaBudget(limits)
    png = blank_png(6000)  # 4.4 KB, 36,000,000 pixels
    decode_image(png, limits, "first", budget)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"second: an image of 6000x6000 .*max_request_pixels"):
            decode_image(png, limits, "second", budget)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_video_is_refused_from_the_frames_it_declares_before_decoding():
    data = blank_mp4(64)  # 6 KB: 64 frames of 1280x720 at 2 fps, all sampled
    limits = MediaLimits(max_request_pixels=40_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"v: a video of 64 sampled 1280x720 frames .*max_request_pixels"):
            decode_video(data, limits, "v", fps=2.0, temporal_patch_size=2, budget=MediaBudget(limits))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    small = MediaLimits(max_request_pixels=64 * 48 * 8)
    budget = MediaBudget(small)
    video = decode_video(blank_mp4(8, 64, 48), small, "v", fps=2.0, temporal_patch_size=2, budget=budget)
    assert video.frames.shape == (8, 48, 64, 3) and budget.pixels == 64 * 48 * 8


def test_the_part_count_is_bounded():
    budget = MediaBudget(MediaLimits(max_media_parts=2))
    budget.add_part("a")
    budget.add_part("b")
    with pytest.raises(ValueError, match="c: over the limit of 2 media parts"):
        budget.add_part("c")
