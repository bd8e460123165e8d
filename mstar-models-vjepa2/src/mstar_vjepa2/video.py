"""Video in: decoding with PyAV (mp4, webm, gif, ...) or Pillow (a list of images), frame
sampling and the preprocessing of ``transformers``' ``VJEPA2VideoProcessor`` in plain torch.

Why not call ``transformers``' processor: it needs ``torchvision``, whose registry wheels
are CUDA builds that do not load beside the CPU ``torch`` pinned here. The steps below are
the processor's (read from its source), and ``tests/vjepa2/test_vjepa2_preprocess.py`` checks the
output against the processor's own, recorded in a throw-away environment where it loads:

1. resize so the short side is ``size.shortest_edge`` (long side ``int(S·long/short)``),
   bilinear with antialiasing, on the uint8 frames;
2. centre crop to ``crop_size`` (top/left = ``int((in − out) / 2)``);
3. ``(x − 255·mean) / (255·std)`` in float32.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class VideoPreprocessing:
    shortest_edge: int
    crop: int
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    rescale_factor: float = 1 / 255

    @classmethod
    def for_crop(cls, crop: int) -> VideoPreprocessing:
        return cls(int(crop * 256 / 224), crop)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path | None, crop: int) -> VideoPreprocessing:
        """From the checkpoint's video processor config, found where transformers finds it
        (``processor_config.json``, ``video_preprocessor_config.json``, then
        ``preprocessor_config.json``); without one, for the model's crop. As the processor
        does, the resize follows the crop: ``shortest_edge = int(crop·256/224)``."""
        from mstar.processor_config import processor_config

        cfg = None if checkpoint_dir is None else processor_config(checkpoint_dir, "video_processor")
        if cfg is None:
            return cls.for_crop(crop)
        c = cfg.get("crop_size", crop)
        c = int(c["height"]) if isinstance(c, dict) else int(c)
        return cls(int(c * 256 / 224), c, tuple(cfg.get("image_mean", cls.mean)), tuple(cfg.get("image_std", cls.std)),
                   float(cfg.get("rescale_factor", 1 / 255)))


def resized_size(height: int, width: int, shortest_edge: int) -> tuple[int, int]:
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest_edge * long / short)
    return (new_long, shortest_edge) if width <= height else (shortest_edge, new_long)


def preprocess(frames: torch.Tensor, p: VideoPreprocessing) -> torch.Tensor:
    """uint8 frames [T, H, W, 3] → pixel_values_videos [T, 3, crop, crop] float32."""
    if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video: expected uint8 RGB frames [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    x = frames.permute(0, 3, 1, 2).contiguous()
    size = resized_size(x.shape[-2], x.shape[-1], p.shortest_edge)
    if size != tuple(x.shape[-2:]):
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    h, w = x.shape[-2:]
    if p.crop > h or p.crop > w:  # pad as the processor does (only for tiny inputs)
        ph, pw = max(p.crop - h, 0), max(p.crop - w, 0)
        x = F.pad(x, (pw // 2, (pw + 1) // 2, ph // 2, (ph + 1) // 2))
        h, w = x.shape[-2:]
    top, left = int((h - p.crop) / 2.0), int((w - p.crop) / 2.0)
    x = x[..., top : top + p.crop, left : left + p.crop]
    mean = torch.tensor(p.mean) * (1.0 / p.rescale_factor)
    std = torch.tensor(p.std) * (1.0 / p.rescale_factor)
    return (x.to(torch.float32) - mean[:, None, None]) / std[:, None, None]


def sample_indices(total: int, num_frames: int | None) -> np.ndarray:
    """Uniform sampling as the processor's ``do_sample_frames`` with ``num_frames``."""
    if num_frames is None:
        return np.arange(total)
    if not 1 <= num_frames <= total:
        raise ValueError(f"num_frames: {num_frames} asked, the video has {total}")
    return np.arange(num_frames, dtype=int) * total // num_frames


MAX_PIXELS_ENV = "MSTAR_MAX_MEDIA_PIXELS"
DEFAULT_MAX_PIXELS = 40_000_000  # decoded pixels per request: frames kept (or images) x height x width


def max_pixels_from_env() -> int:
    """``$MSTAR_MAX_MEDIA_PIXELS``, else ``DEFAULT_MAX_PIXELS``."""
    import os

    raw = os.environ.get(MAX_PIXELS_ENV, "").strip()
    try:
        return int(raw) if raw else DEFAULT_MAX_PIXELS
    except ValueError:
        raise ValueError(f"{MAX_PIXELS_ENV}={raw!r} is not a whole number") from None


def _check_pixels(frames: int, height: int, width: int, max_pixels: int, what: str) -> None:
    if frames * height * width > max_pixels:
        raise ValueError(f"{what}: {frames} frames of {width}x{height} would decode {frames * height * width} pixels, over "
                         f"the limit of {max_pixels} decoded pixels per request ({MAX_PIXELS_ENV})")


def decode_video(data: bytes, max_frames: int, num_frames: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """An encoded video file (any container/codec FFmpeg reads: mp4, webm, gif, ...) →
    uint8 RGB frames [T, H, W, 3]: all of them, or the ``num_frames`` that ``sample_indices``
    picks. More than ``max_frames`` frames in the file is an error, and so is keeping more
    than ``max_pixels`` pixels: checked from the frame count and size the container declares
    before decoding, and frame by frame while decoding. With ``num_frames``, a first pass counts
    the frames (each dropped as it is decoded) and the second keeps only the sampled ones."""
    import av

    try:
        with av.open(io.BytesIO(data)) as box:
            if not box.streams.video:
                raise ValueError("video: the file has no video stream")
            stream = box.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            declared = int(stream.frames or 0)
            if declared > max_frames:
                raise ValueError(f"video: more than {max_frames} frames; send fewer or set num_frames")
            if num_frames is None:
                keep = None
                if declared:
                    _check_pixels(declared, height, width, max_pixels, "video")
            else:
                total = 0
                for _ in box.decode(video=0):
                    total += 1
                    if total > max_frames:
                        raise ValueError(f"video: more than {max_frames} frames; send fewer or set num_frames")
                keep = set(sample_indices(total, num_frames).tolist()) if total else set()
                _check_pixels(len(keep), height, width, max_pixels, "video")
                box.seek(0)
            frames: list[np.ndarray] = []
            pixels = 0
            for i, frame in enumerate(box.decode(video=0)):
                if keep is None and i == max_frames:
                    raise ValueError(f"video: more than {max_frames} frames; send fewer or set num_frames")
                if keep is not None and i not in keep:
                    continue
                pixels += frame.width * frame.height
                if pixels > max_pixels:
                    raise ValueError(f"video: its frames would decode more than {max_pixels} pixels, over the limit of "
                                     f"decoded pixels per request ({MAX_PIXELS_ENV})")
                frames.append(frame.to_ndarray(format="rgb24"))
    except av.error.FFmpegError as exc:
        raise ValueError(f"video: cannot decode the file ({exc})") from None
    if not frames:
        raise ValueError("video: the file holds no frame")
    if keep is not None and len(frames) != len(keep):
        raise ValueError("video: the file decoded differently on a second pass")
    return torch.from_numpy(np.stack(frames))


def decode_images(files: list[bytes], max_pixels: int = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """A list of image files (PNG, JPEG, ...) → uint8 RGB frames [T, H, W, 3] (same size).
    Sizes are read from the headers and checked against ``max_pixels`` (over all images)
    before any is decoded."""
    from PIL import Image, UnidentifiedImageError

    opened = []
    pixels = 0
    try:
        for i, data in enumerate(files):
            try:
                img = Image.open(io.BytesIO(data))  # lazy: the header only
            except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
                raise ValueError(f"images[{i}]: cannot decode ({exc})") from None
            opened.append(img)
            pixels += img.width * img.height
            if pixels > max_pixels:
                raise ValueError(f"images[{i}]: the images would decode more than {max_pixels} pixels, over the limit of "
                                 f"decoded pixels per request ({MAX_PIXELS_ENV})")
        out = []
        for i, img in enumerate(opened):
            try:
                out.append(np.asarray(img.convert("RGB")))
            except (OSError, Image.DecompressionBombError) as exc:
                raise ValueError(f"images[{i}]: cannot decode ({exc})") from None
    finally:
        for img in opened:
            img.close()
    if not out or any(o.shape != out[0].shape for o in out):
        raise ValueError("images: give one or more images of one size")
    return torch.from_numpy(np.stack(out))
