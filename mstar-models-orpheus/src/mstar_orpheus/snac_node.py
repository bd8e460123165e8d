"""Node ``snac``: decodes one 28-code window of the code stream into 2048 new samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.model.submodule_base import (
    BatchedModelOutput,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
)

from mstar_orpheus.audio_codes import WINDOW_CODES, emitted_samples, valid_windows, window_levels
from mstar_orpheus.noise import CodeSeededNoise, window_seeds
from mstar_orpheus.snac_model import SnacConfig, SnacDecoder


class SnacNode(NodeSubmodule):
    def __init__(self, snac_config: dict[str, Any]) -> None:
        super().__init__()
        self.snac_cfg = SnacConfig.from_dict(snac_config)
        if len(self.snac_cfg.vq_strides) != 3:
            raise ValueError(f"Orpheus frames need a 3-level SNAC, got vq_strides {self.snac_cfg.vq_strides}")
        self.snac = SnacDecoder(self.snac_cfg)
        # One frame = one level-0 code = vq_strides[0] latent steps of hop_length samples.
        self.emit = emitted_samples(self.snac_cfg.hop_length * self.snac_cfg.vq_strides[0])

    def get_autocast_dtype(self) -> torch.dtype:
        return torch.float32

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Batch size changes conv kernels' rounding; decoding each window alone keeps a
        # seeded request's audio byte-identical whatever else is running.
        return False

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        window = torch.as_tensor(signals["code_window"]).reshape(-1).to(torch.long)
        if window.numel() != WINDOW_CODES:
            raise ValueError(f"a SNAC window holds {WINDOW_CODES} codes, got {window.numel()}")
        return NodeInputs(tensor_inputs={"window": window}, input_seq_len=WINDOW_CODES)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.snac.decoder.model[0].weight.device
        return {"windows": torch.stack([i.tensor_inputs["window"] for i in inputs]).to(device)}

    def decode_windows(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 28] codes -> ([B, samples] the emitted samples, [B] window valid)."""
        valid = valid_windows(windows, self.snac_cfg.codebook_size)
        safe = torch.where(valid[:, None], windows, 0)  # invalid windows decode zeros, then drop
        noise = CodeSeededNoise(window_seeds(safe)) if self.snac_cfg.noise else None
        audio = self.snac(window_levels(safe), noise)
        return audio[:, 0, self.emit], valid

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, windows: torch.Tensor) -> BatchedModelOutput:
        keep = valid_windows(windows, self.snac_cfg.codebook_size).tolist()
        if not any(keep):  # nothing to emit (the official decoder skips such windows)
            return BatchedModelOutput()
        audio, _ = self.decode_windows(windows)
        return BatchedModelOutput(
            per_rid_outputs={rid: {"audio": audio[b]} for b, rid in enumerate(engine_inputs.request_ids) if keep[b]}
        )
