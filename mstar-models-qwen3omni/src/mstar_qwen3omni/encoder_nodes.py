"""Nodes ``audio_encoder`` and ``vision_encoder``: stateless, one forward over the media of
every request in the batch. A step reads the processor's tensors (``AUDIO_INPUTS``, ...) from
the request's signals and returns the request's outputs (placeholder embeddings, deepstack
features) as persisted signals the Thinker's prefill reads."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import torch
from mstar.model.digest import tensor_digest
from mstar.model.submodule_base import (
    BatchedModelOutput,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
)
from mstar.weights import load_weights

from mstar_qwen3omni.audio_encoder import (
    AudioEncoder,
    AudioEncoderConfig,
    audio_output_lengths,
    pack_features,
)
from mstar_qwen3omni.checkpoint_keys import AUDIO_TOWER_KEYS, VISION_TOWER_KEYS
from mstar_qwen3omni.vision_encoder import VisionEncoder, VisionEncoderConfig, vision_token_counts

# Walks and the request signals they read and write (names of the processor's tensors).
ENCODE_AUDIO, ENCODE_IMAGE, ENCODE_VIDEO = "encode_audio", "encode_image", "encode_video"
AUDIO_INPUTS = ("input_features", "feature_attention_mask")
IMAGE_INPUTS = ("pixel_values", "image_grid_thw")
VIDEO_INPUTS = ("pixel_values_videos", "video_grid_thw")
AUDIO_OUTPUTS = ("audio_embeds",)
IMAGE_OUTPUTS = ("image_embeds", "image_deepstack")
VIDEO_OUTPUTS = ("video_embeds", "video_deepstack")


def _media_key(graph_walk: str, inputs: NodeInputs) -> Hashable:
    """The same media (the processor's exact tensors) encodes to the same outputs."""
    return graph_walk, tensor_digest(*(inputs.tensor_inputs[k] for k in sorted(inputs.tensor_inputs)))


def _require(signals: Mapping[str, torch.Tensor], names: tuple[str, ...], kind: str) -> None:
    missing = [n for n in names if signals.get(n) is None]
    if missing:
        raise ValueError(f"request kwarg media names {kind!r} but the inputs lack {missing}")


class AudioEncoderNode(NodeSubmodule):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.encoder = AudioEncoder(cfg)

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        _require(signals, AUDIO_INPUTS, "audio")
        feats, mask = torch.as_tensor(signals["input_features"]), torch.as_tensor(signals["feature_attention_mask"])
        if feats.dim() != 3 or mask.shape != (feats.shape[0], feats.shape[2]) or feats.shape[1] != self.encoder.cfg.num_mel_bins:
            raise ValueError(
                f"input_features must be [audios, {self.encoder.cfg.num_mel_bins}, frames] with a matching "
                f"feature_attention_mask; got {list(feats.shape)} and {list(mask.shape)}"
            )
        packed, lens = pack_features(feats, mask)
        return NodeInputs(tensor_inputs={"features": packed, "lens": lens})

    def output_cache_key(self, graph_walk: str, info: CurrentForwardPassInfo, inputs: NodeInputs) -> Hashable:
        return _media_key(graph_walk, inputs)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.encoder.proj2.weight.device
        lens = [i.tensor_inputs["lens"] for i in inputs]
        # One padding group per request: its audios were one call in transformers.
        groups = torch.cat([torch.full_like(n, row) for row, n in enumerate(lens)])
        return {
            "features": torch.cat([i.tensor_inputs["features"] for i in inputs], dim=1).to(device),
            "lens": torch.cat(lens).to(device),
            "groups": groups.to(device),
            "per_row": [int(audio_output_lengths(n, self.encoder.cfg.n_window).sum()) for n in lens],
        }

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, features: torch.Tensor, lens: torch.Tensor,
        groups: torch.Tensor, per_row: list[int],
    ) -> BatchedModelOutput:
        tokens = self.encoder(features, lens, groups)
        return BatchedModelOutput(
            per_rid_outputs={rid: {"audio_embeds": t} for rid, t in zip(engine_inputs.request_ids, tokens.split(per_row), strict=True)}
        )


class VisionEncoderNode(NodeSubmodule):
    """Walk ``encode_image`` reads the image tensors, ``encode_video`` the video ones."""

    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.encoder = VisionEncoder(cfg)

    def _names(self, walk: str) -> tuple[tuple[str, str], tuple[str, str]]:
        return (VIDEO_INPUTS, VIDEO_OUTPUTS) if walk == ENCODE_VIDEO else (IMAGE_INPUTS, IMAGE_OUTPUTS)

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        (pixels_name, grid_name), _ = self._names(info.walk)
        _require(signals, (pixels_name, grid_name), "video" if info.walk == ENCODE_VIDEO else "image")
        pixels, grid = torch.as_tensor(signals[pixels_name]), torch.as_tensor(signals[grid_name]).to(torch.long)
        cfg = self.encoder.cfg
        width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        if grid.dim() != 2 or grid.shape[1] != 3 or pixels.shape != (int(grid.prod(-1).sum()), width):
            raise ValueError(f"{pixels_name} {list(pixels.shape)} does not match {grid_name} {grid.tolist()} (patch width {width})")
        return NodeInputs(tensor_inputs={"pixels": pixels, "grid": grid})

    def output_cache_key(self, graph_walk: str, info: CurrentForwardPassInfo, inputs: NodeInputs) -> Hashable:
        return _media_key(graph_walk, inputs)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.encoder.patch_embed.proj.weight.device
        grids = [i.tensor_inputs["grid"] for i in inputs]
        return {
            "pixels": torch.cat([i.tensor_inputs["pixels"] for i in inputs]).to(device),
            "grid": torch.cat(grids).to(device),
            "per_row": [int(vision_token_counts(g, self.encoder.cfg.spatial_merge_size).sum()) for g in grids],
        }

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, pixels: torch.Tensor, grid: torch.Tensor, per_row: list[int]
    ) -> BatchedModelOutput:
        out = self.encoder(pixels.to(self.encoder.patch_embed.proj.weight.dtype), grid)
        deep = torch.stack(out.deepstack) if out.deepstack else out.embeds.new_zeros(0, *out.embeds.shape)
        per_rid: dict[str, dict[str, torch.Tensor]] = {}
        for rid, embeds, ds in zip(engine_inputs.request_ids, out.embeds.split(per_row), deep.split(per_row, dim=1), strict=True):
            embeds_name, deep_name = self._names(engine_inputs.per_request_info[rid].walk)[1]
            per_rid[rid] = {embeds_name: embeds, deep_name: ds}
        return BatchedModelOutput(per_rid_outputs=per_rid)


def build_audio_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str,
                        dtype: torch.dtype = torch.float32) -> AudioEncoderNode:
    cfg = AudioEncoderConfig.from_dict(config["thinker_config"]["audio_config"])
    with torch.device(device):
        node = AudioEncoderNode(cfg).to(dtype)
    if checkpoint_dir is not None:
        load_weights(node.encoder, checkpoint_dir, **AUDIO_TOWER_KEYS)
    return node


def build_vision_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str,
                         dtype: torch.dtype = torch.float32) -> VisionEncoderNode:
    cfg = VisionEncoderConfig.from_dict(config["thinker_config"]["vision_config"])
    with torch.device(device):
        node = VisionEncoderNode(cfg).to(dtype)
    if checkpoint_dir is not None:
        load_weights(node.encoder, checkpoint_dir, **VISION_TOWER_KEYS)
    return node
