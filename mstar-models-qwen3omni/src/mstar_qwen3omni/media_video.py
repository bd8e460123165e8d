"""Video frames -> ``pixel_values_videos`` + ``video_grid_thw`` in plain torch, with the same
results as transformers' ``Qwen2VLVideoProcessor`` (which needs torchvision; the registry's
torchvision wheels do not load beside the CPU torch pinned here). Tested against that
processor's output through committed fixtures (``tools/make_processor_fixtures.py``).

``VideoFrameProcessor`` is a ``transformers`` ``VideoProcessorMixin``, so it plugs into
``Qwen3OmniMoeProcessor`` in place of the torchvision one; the processor still does the prompt
expansion (video tokens, audio interleaved with video). It takes frames already sampled
(``media.decode_video`` samples them) and never decodes files itself:

    proc = VideoFrameProcessor.from_config(preprocessor_config_dict)
    out = proc([frames_uint8_THWC, ...], size={...})     # the processor passes its kwargs

Steps per video: resize both sides to multiples of ``patch_size * merge_size`` with the pixel
count inside [shortest_edge, longest_edge] (bicubic with antialiasing on uint8, as torchvision
does on tensors), rescale and normalise, repeat the last frame up to a multiple of
``temporal_patch_size``, and flatten into patches in merge-block order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers.feature_extraction_utils import BatchFeature
from transformers.video_processing_utils import VideoProcessorMixin

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def fit_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Nearest size with both sides multiples of ``factor`` and a pixel count in range,
    keeping the aspect ratio (the Qwen2-VL rule)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"video aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def _size_limits(size: Any) -> tuple[int, int]:
    get = size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)
    low, high = get("shortest_edge"), get("longest_edge")
    if not low or not high:
        raise ValueError(f"video size needs 'shortest_edge' and 'longest_edge' (pixel counts), got {size}")
    return int(low), int(high)


class VideoFrameProcessor(VideoProcessorMixin):
    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(
        self,
        size: dict | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        patch_size: int = 14,
        temporal_patch_size: int = 2,
        merge_size: int = 2,
        image_mean: tuple[float, ...] = CLIP_MEAN,
        image_std: tuple[float, ...] = CLIP_STD,
        do_resize: bool = True,
        do_rescale: bool = True,
        rescale_factor: float = 1 / 255,
        do_normalize: bool = True,
        cap_pixels_per_frame: bool | None = None,
        max_video_tokens: int = 128000,
        **_: Any,
    ) -> None:
        size = dict(size or {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768})
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        # No super().__init__: the mixin's constructor expects the torchvision backend's kwargs.
        self.size = size
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.merge_size = merge_size
        self.image_mean = tuple(image_mean)
        self.image_std = tuple(image_std)
        self.do_resize = do_resize
        self.do_rescale = do_rescale
        self.rescale_factor = rescale_factor
        self.do_normalize = do_normalize
        self.cap_pixels_per_frame = bool(cap_pixels_per_frame)
        self.max_video_tokens = max_video_tokens

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> VideoFrameProcessor:
        return cls(**config)

    def to_dict(self) -> dict[str, Any]:
        return {"video_processor_type": type(self).__name__, "size": dict(self.size)}

    def __call__(self, videos: list[Any], **kwargs: Any) -> BatchFeature:
        size = kwargs.get("size") or self.size
        patch = kwargs.get("patch_size") or self.patch_size
        merge = kwargs.get("merge_size") or self.merge_size
        temporal = kwargs.get("temporal_patch_size") or self.temporal_patch_size
        mean = kwargs.get("image_mean") or self.image_mean
        std = kwargs.get("image_std") or self.image_std
        cap = kwargs.get("cap_pixels_per_frame")
        cap = self.cap_pixels_per_frame if cap is None else cap
        low, high = _size_limits(size)
        patches, grids = [], []
        for video in videos:
            frames = self._to_tensor(video)  # (T, C, H, W) uint8
            if self.do_resize:
                frames = self._resize(frames, patch * merge, low, high, temporal, cap)
            x = self._normalise(frames, mean, std)
            flat, grid = self._patchify(x, patch, merge, temporal)
            patches.append(flat)
            grids.append(grid)
        return BatchFeature(
            {"pixel_values_videos": torch.cat(patches), "video_grid_thw": torch.tensor(grids)},
            tensor_type=kwargs.get("return_tensors"),
        )

    @staticmethod
    def _to_tensor(video: Any) -> torch.Tensor:
        frames = torch.as_tensor(np.asarray(video)) if not isinstance(video, torch.Tensor) else video
        if frames.ndim != 4 or frames.shape[-1] not in (1, 3, 4):
            raise ValueError(f"video frames must be (frames, height, width, channels), got {tuple(frames.shape)}")
        frames = frames[..., :3] if frames.shape[-1] == 4 else frames.expand(*frames.shape[:-1], 3)
        return frames.permute(0, 3, 1, 2).contiguous().to(torch.uint8)

    def _resize(self, frames: torch.Tensor, factor: int, low: int, high: int, temporal: int, cap: bool) -> torch.Tensor:
        if cap:
            # Per-frame share of a whole-video pixel budget, floored just above the minimum.
            budget = int(self.max_video_tokens * factor * factor * 0.9)
            high = max(min(high, budget * temporal // frames.shape[0]), int(low * 1.05))
        h, w = fit_size(frames.shape[-2], frames.shape[-1], factor, low, high)
        if (h, w) == tuple(frames.shape[-2:]):
            return frames
        return F.interpolate(frames, size=(h, w), mode="bicubic", align_corners=False, antialias=True)

    def _normalise(self, frames: torch.Tensor, mean: Any, std: Any) -> torch.Tensor:
        x = frames.to(torch.float32)
        if self.do_rescale and self.do_normalize:
            scale = 1.0 / self.rescale_factor  # rescale folded into mean/std, as transformers does
            m = torch.tensor(mean) * scale
            s = torch.tensor(std) * scale
            return (x - m[:, None, None]) / s[:, None, None]
        if self.do_normalize:
            return (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
        return x * self.rescale_factor if self.do_rescale else x

    @staticmethod
    def _patchify(x: torch.Tensor, patch: int, merge: int, temporal: int) -> tuple[torch.Tensor, list[int]]:
        if pad := -x.shape[0] % temporal:
            x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
        t, c, h, w = x.shape
        gt, gh, gw = t // temporal, h // patch, w // patch
        x = x.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
        # -> (time, block row, block col, row in block, col in block, channel, frame, y, x)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(gt * gh * gw, c * temporal * patch * patch), [gt, gh, gw]
