"""The HTTP side of both models, on ``POST /v1/generate`` (see docs/vjepa2.md).

Inputs (``inputs`` of the request), decoded here in the preprocess pool:

- ``video`` / ``goal``: an encoded video file (mp4, webm, gif, ...) as a 1-D uint8 tensor of
  its bytes (``{"dtype": "uint8", "shape": [n], "data": <base64 of the file>}``); or a list
  of base64 image files; or raw RGB frames (uint8 ``[T, H, W, 3]``); or preprocessed pixel
  values (float ``[T, 3, crop, crop]``). ``kwargs.num_frames`` samples that many frames
  uniformly (as the ``transformers`` processor does).
- ``context_mask`` / ``target_mask`` (``vjepa2``): token indices.
- ``actions`` / ``states`` / ``candidates`` / ``goal_latents`` / ``latents`` (``vjepa2ac``):
  JSON arrays or tensors, checked against the checkpoint's action dimension here.

Each bad field is a 400 naming it (``param``: ``inputs.video``, ``inputs.actions``, ...).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

import torch
from mstar.api import ApiAdapter, ApiError, EngineRequest
from mstar.api.protocol import GenerateRequest
from mstar.api.tensors import tensor_from_json

from mstar_vjepa2.video import (
    VideoPreprocessing,
    decode_images,
    decode_video,
    max_pixels_from_env,
    preprocess,
    sample_indices,
)
from mstar_vjepa2.walks import VJEPA2_TASKS, VJEPA2AC_TASKS

DECODE_CAP = 1024  # frames decoded at most when num_frames asks to sample from a long video


def _bad(name: str, message: str) -> ApiError:
    return ApiError(400, f"{name}: {message}", param=f"inputs.{name}")


class _VideoAdapter(ApiAdapter):
    """Shared by both models: video decoding and the float tensor inputs."""

    def warmup_request(self) -> GenerateRequest:
        """Encode one two-frame clip of raw RGB frames: decoding, preprocessing and the
        encoder all run once before the server opens its port."""
        from mstar.api.tensors import tensor_to_json

        frames = torch.full((2, self.crop, self.crop, 3), 128, dtype=torch.uint8)
        return GenerateRequest(model="", inputs={"video": tensor_to_json(frames)}, kwargs={"task": "encode"})

    tasks: Any
    crop: int
    max_frames: int

    def _video(self, request: GenerateRequest, name: str, num_frames: int | None) -> torch.Tensor:
        value = request.inputs[name]
        try:
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                try:
                    frames = decode_images([base64.b64decode(v, validate=True) for v in value], max_pixels_from_env())
                except binascii.Error:
                    raise ValueError("a list of images must hold base64 strings") from None
            else:
                t = tensor_from_json(value, name)
                if t.dtype == torch.uint8 and t.dim() == 1:
                    cap = DECODE_CAP if num_frames is not None else self.max_frames
                    frames = decode_video(t.numpy().tobytes(), cap, num_frames, max_pixels_from_env())
                elif t.dtype == torch.uint8 and t.dim() == 4:
                    frames = t
                elif torch.is_floating_point(t) and t.dim() == 4:
                    return self._check_len(name, t.to(torch.float32))
                else:
                    raise ValueError(f"expected a video file (uint8 [bytes]), RGB frames (uint8 [T, H, W, 3]) or pixel values "
                                     f"(float [T, 3, {self.crop}, {self.crop}]), got {t.dtype} {list(t.shape)}")
            frames = frames[torch.from_numpy(sample_indices(frames.shape[0], num_frames))]
            return self._check_len(name, preprocess(frames, self.preprocessing))
        except ApiError:
            raise
        except ValueError as exc:
            raise _bad(name, str(exc).removeprefix(f"{name}: ").removeprefix("video: ")) from None

    def _check_len(self, name: str, video: torch.Tensor) -> torch.Tensor:
        if video.shape[0] > self.max_frames:
            raise _bad(name, f"{video.shape[0]} frames; this model takes at most {self.max_frames} (set kwargs.num_frames to sample)")
        return video

    def _floats(self, request: GenerateRequest, name: str, ndim: int, last: int | None, what: str) -> torch.Tensor:
        t = tensor_from_json(request.inputs[name], name)
        if t.dim() != ndim or (last is not None and t.shape[-1] != last) or t.numel() == 0:
            raise _bad(name, f"expected {what}, got {list(t.shape)}")
        return t.to(torch.float32)

    def _common(self, request: GenerateRequest) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        kwargs = dict(request.kwargs)
        try:
            self.tasks.check_task(kwargs)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="kwargs.task") from None
        num = kwargs.get("num_frames")
        if num is not None and (not isinstance(num, int) or num < 1):
            raise ApiError(400, "num_frames: a positive integer", param="kwargs.num_frames")
        inputs = {}
        for name in ("video", "goal"):
            if name in request.inputs:
                inputs[name] = self._video(request, name, num)
        return inputs, kwargs


class VJEPA2Adapter(_VideoAdapter):
    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        from mstar_vjepa2.config import from_hf_dict

        cfg = from_hf_dict(config)
        self.tasks, self.crop, self.max_frames = VJEPA2_TASKS, cfg.crop_size, cfg.frames_per_clip
        self.preprocessing = VideoPreprocessing.from_checkpoint(checkpoint_dir, cfg.crop_size)
        self.tokens_per_tubelet, self.tubelet = cfg.tokens_per_tubelet, cfg.tubelet_size

    def generate_inputs(self, request: GenerateRequest) -> EngineRequest:
        inputs, kwargs = self._common(request)
        if "video" not in inputs:
            raise ApiError(400, "video: required", param="inputs.video")
        n = max(1, inputs["video"].shape[0] // self.tubelet) * self.tokens_per_tubelet
        for name in ("context_mask", "target_mask"):
            if name in request.inputs:
                ids = tensor_from_json(request.inputs[name], name)
                if torch.is_floating_point(ids) or ids.dim() != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= n:
                    raise _bad(name, f"expected token indices in [0, {n}) (the clip has {n} tokens)")
                inputs[name] = ids.to(torch.long)
        return EngineRequest(inputs, kwargs)



class VJEPA2ACAdapter(_VideoAdapter):
    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.tasks, self.crop, self.max_frames = VJEPA2AC_TASKS, config["img_size"], config["max_frames"]
        self.preprocessing = VideoPreprocessing.from_checkpoint(checkpoint_dir, self.crop)
        self.action_dim, self.embed_dim = config["action_dim"], config["embed_dim"]

    def generate_inputs(self, request: GenerateRequest) -> EngineRequest:
        inputs, kwargs = self._common(request)
        a = self.action_dim
        shapes = {"actions": (2, a, f"[frames, {a}] (action dimension {a})"),
                  "states": (2, a, f"[frames, {a}] (state dimension {a})"),
                  "candidates": (3, a, f"[K, horizon, {a}] (action dimension {a})"),
                  "latents": (2, self.embed_dim, f"[tokens, {self.embed_dim}]"),
                  "goal_latents": (2, self.embed_dim, f"[tokens, {self.embed_dim}]")}
        for name, (ndim, last, what) in shapes.items():
            if name in request.inputs:
                inputs[name] = self._floats(request, name, ndim, last, what)
        task = kwargs.get("task", "rollout")
        if task in ("rollout", "plan", "encode") and "video" not in inputs:
            raise ApiError(400, "video: required for this task", param="inputs.video")
        if task in ("rollout", "rollout_latents"):
            for name in ("actions", "states"):
                if name not in inputs:
                    raise _bad(name, f"required for a rollout, [frames, {a}]")
        if task in ("plan", "plan_latents"):
            if "states" not in inputs:
                raise _bad("states", f"required for planning, [frames, {a}]")
            if "goal" not in inputs and "goal_latents" not in inputs:
                raise _bad("goal", "required for planning (a goal image/video, or goal_latents)")
        return EngineRequest(inputs, kwargs)

