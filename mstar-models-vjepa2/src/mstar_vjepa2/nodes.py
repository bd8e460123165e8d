"""``vjepa2`` nodes: the video encoder and the masked predictor, both stateless."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.model.submodule_base import (
    STOP_ALL,
    BatchedModelOutput,
    BatchedStopCheck,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
    StopCheck,
)

from mstar_vjepa2.config import VJEPA2Config
from mstar_vjepa2.vit import Encoder, Predictor


def check_video(video: torch.Tensor, cfg: VJEPA2Config, max_frames: int, name: str = "video") -> torch.Tensor:
    """A preprocessed clip [T, C, H, W] (float), or ValueError naming the input."""
    if not torch.is_floating_point(video) or video.dim() != 4:
        raise ValueError(f"{name}: expected preprocessed pixel values [frames, {cfg.in_chans}, {cfg.crop_size}, "
                         f"{cfg.crop_size}] (float), got {video.dtype} {list(video.shape)}")
    if tuple(video.shape[1:]) != (cfg.in_chans, cfg.crop_size, cfg.crop_size):
        raise ValueError(f"{name}: frames must be [{cfg.in_chans}, {cfg.crop_size}, {cfg.crop_size}], got {list(video.shape[1:])}")
    if not 1 <= video.shape[0] <= max_frames:
        raise ValueError(f"{name}: {video.shape[0]} frames; this model takes 1 to {max_frames}")
    return video


def pad_stack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths (dim 0) → [B, max, ...] zero-padded, and the lengths."""
    lengths = torch.tensor([t.shape[0] for t in tensors])
    out = tensors[0].new_zeros((len(tensors), int(lengths.max()), *tensors[0].shape[1:]))
    for b, t in enumerate(tensors):
        out[b, : t.shape[0]] = t
    return out, lengths


class EncoderNode(NodeSubmodule):
    """video [T, C, H, W] → latents [N, D]. Clips of any length batch together (padded)."""

    def __init__(self, cfg: VJEPA2Config, tasks: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.tasks = tasks
        self.encoder = Encoder(cfg)

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        self.tasks.check_task(info.request_kwargs)
        video = check_video(signals["video"], self.cfg, self.cfg.frames_per_clip)
        return NodeInputs(tensor_inputs={"video": video}, input_seq_len=video.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        video, frames = pad_stack([i.tensor_inputs["video"] for i in inputs])
        device = self.encoder.layernorm.weight.device
        return {"video": video.to(device), "frames": frames}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, video: torch.Tensor, frames: torch.Tensor) -> BatchedModelOutput:
        latents, lengths = self.encoder(video, frames)
        per_rid = {rid: {"latents": latents[b, : int(lengths[b])]} for b, rid in enumerate(engine_inputs.request_ids)}
        return BatchedModelOutput(per_rid_outputs=per_rid)


def _indices(signals: Mapping[str, torch.Tensor], name: str, n: int) -> torch.Tensor:
    if name not in signals:
        return torch.arange(n)
    ids = signals[name]
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8) or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D list of token indices, got {ids.dtype} {list(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= n:
        raise ValueError(f"{name}: token indices must lie in [0, {n}) for this clip")
    return ids.to(torch.long)


class PredictorNode(NodeSubmodule):
    """``predict`` walk: latents [N, D] (+ optional ``context_mask`` / ``target_mask`` token
    indices, default all tokens) → predictions [Nt, D] for the target tokens.

    ``anticipate`` walk (upstream's anticipation wrapper): a sliding window. Each step
    predicts ``output_frames`` frames lying ``skip_frames`` frames past the window's end
    (positions relative to the window), then slides: the oldest tokens leave, the
    prediction joins. ``kwargs.anticipate = {"steps", "output_frames", "skip_frames"}``."""

    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.predictor = Predictor(cfg)

    def _anticipation(self, kwargs: Mapping[str, Any]) -> tuple[int, int, int]:
        a = dict(kwargs.get("anticipate", {}))
        t = self.cfg.tubelet_size
        steps, out_frames, skip = int(a.get("steps", 1)), int(a.get("output_frames", t)), int(a.get("skip_frames", 0))
        if steps < 1 or out_frames < 1 or skip < 0:
            raise ValueError("anticipate: steps >= 1, output_frames >= 1 and skip_frames >= 0 are required")
        per = self.cfg.tokens_per_tubelet
        return steps, max(out_frames, t) // t * per, skip // t * per

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        if graph_walk == "anticipate":
            window = signals.get("window", signals["latents"])
            n = window.shape[0]
            steps, n_pred, skip = self._anticipation(info.request_kwargs)
            if n_pred > n:
                raise ValueError(f"anticipate: output_frames give {n_pred} tokens, more than the clip's {n}")
            ctx, tgt = torch.arange(n), n + skip + torch.arange(n_pred)
            return NodeInputs(tensor_inputs={"latents": window, "context": ctx, "target": tgt},
                              kwargs={"last": info.iteration + 1 >= steps}, input_seq_len=n)
        latents = signals["latents"]
        n = latents.shape[0]
        ctx, tgt = _indices(signals, "context_mask", n), _indices(signals, "target_mask", n)
        return NodeInputs(tensor_inputs={"latents": latents, "context": ctx, "target": tgt}, input_seq_len=n)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.predictor.proj.weight.device
        out: dict[str, Any] = {"last": [i.kwargs.get("last", True) for i in inputs]}
        for key in ("latents", "context", "target"):
            padded, lengths = pad_stack([i.tensor_inputs[key] for i in inputs])
            out[key], out[f"{key}_len"] = padded.to(device), lengths.to(device)
        return out

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, latents: torch.Tensor, latents_len: torch.Tensor,
                        context: torch.Tensor, context_len: torch.Tensor, target: torch.Tensor, target_len: torch.Tensor,
                        last: list[bool]) -> BatchedModelOutput:
        pred = self.predictor(latents, context, context_len, target, target_len)
        per_rid: dict[str, dict[str, torch.Tensor]] = {}
        for b, rid in enumerate(engine_inputs.request_ids):
            p = pred[b, : int(target_len[b])]
            if graph_walk != "anticipate":
                per_rid[rid] = {"predictions": p}
                continue
            window = latents[b, : int(latents_len[b])]
            per_rid[rid] = {"anticipated": p, "window": torch.cat([window[p.shape[0] :], p]),
                            "last": torch.tensor(last[b])}
        return BatchedModelOutput(per_rid_outputs=per_rid)

    def check_stop_batched(self, request_ids: list[str], infos: list[CurrentForwardPassInfo],
                           outputs: BatchedModelOutput) -> BatchedStopCheck:
        """An anticipation ends after the row marked ``last``."""
        end = StopCheck(frozenset({STOP_ALL}), reason="stop")
        return BatchedStopCheck({rid: end for rid in request_ids
                                 if "last" in outputs.per_rid_outputs.get(rid, {}) and bool(outputs.per_rid_outputs[rid]["last"])})
