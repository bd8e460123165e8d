"""Video preprocessing vs ``transformers``' VJEPA2VideoProcessor: its outputs were recorded
by mstar-models-vjepa2/tools/make_fixtures.sh in an environment where torchvision loads,
for the frames of fixtures/clip.mp4 (written there with PyAV)."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from mstar_vjepa2.video import (
    VideoPreprocessing,
    decode_images,
    decode_video,
    preprocess,
    sample_indices,
)
from PIL import Image
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURES / "preprocess_reference.safetensors"))


def test_decoding_the_mp4_gives_the_reference_frames(ref):
    frames = decode_video((FIXTURES / "clip.mp4").read_bytes(), max_frames=64)
    assert torch.equal(frames, ref["decoded"])


@pytest.mark.parametrize("crop", [16, 24])
def test_pixel_values_equal_the_processor(ref, crop):
    got = preprocess(ref["decoded"], VideoPreprocessing.for_crop(crop))
    want = ref[f"pixel_values_videos_{crop}"]
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-6


@pytest.mark.parametrize("crop", [16, 24])
def test_sampled_frames_equal_the_processor(ref, crop):
    frames = ref["decoded"]
    idx = sample_indices(frames.shape[0], 4)
    got = preprocess(frames[torch.from_numpy(idx)], VideoPreprocessing.for_crop(crop))
    assert (got - ref[f"pixel_values_videos_{crop}_sampled4"]).abs().max().item() < 1e-6


def _write_mp4(n: int, w: int = 32, h: int = 24, fmt: str = "mp4", codec: str = "libx264") -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as box:
        s = box.add_stream(codec, rate=8)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            img = np.full((h, w, 3), (i * 25) % 256, dtype=np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                box.mux(p)
        for p in s.encode():
            box.mux(p)
    return buf.getvalue()


def test_a_pyav_mp4_written_here_decodes_to_its_frames():
    frames = decode_video(_write_mp4(5), max_frames=8)
    assert frames.shape == (5, 24, 32, 3)
    assert abs(int(frames[3].float().mean()) - 75) <= 2  # the 4th frame's grey level


def test_bad_and_long_videos_are_rejected_naming_the_field():
    with pytest.raises(ValueError, match="video: cannot decode"):
        decode_video(b"not a video at all", max_frames=8)
    with pytest.raises(ValueError, match="more than 4 frames"):
        decode_video(_write_mp4(6), max_frames=4)


def test_a_list_of_images_becomes_frames():
    imgs = []
    for v in (10, 200):
        buf = io.BytesIO()
        Image.fromarray(np.full((6, 8, 3), v, dtype=np.uint8)).save(buf, format="PNG")
        imgs.append(buf.getvalue())
    frames = decode_images(imgs)
    assert frames.shape == (2, 6, 8, 3) and int(frames[1, 0, 0, 0]) == 200
    with pytest.raises(ValueError, match=r"images\[1\]"):
        decode_images([imgs[0], b"junk"])
