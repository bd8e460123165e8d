"""Node ``snac``: decodes one 28-code window of the code stream into 2048 new samples.

Windows of several requests share decoder calls of exactly ``batch`` rows (padded with
all-zero windows, dropped after), so a row's arithmetic never depends on how many real
rows share the call: a seeded request's audio stays byte-identical whatever else runs.
"""

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

BATCH_KEY = "mstar_codec_batch"  # config.json: rows per SNAC call (default: 8 on CUDA, else 1)


def codec_batch(config: Mapping[str, Any], device: str) -> int:
    """Rows per SNAC call: the config's ``mstar_codec_batch``, else by device (padding
    rows cost little on a GPU and full compute on a CPU)."""
    value = config.get(BATCH_KEY)
    if value is None:
        return 8 if torch.device(device).type == "cuda" else 1
    if int(value) < 1:
        raise ValueError(f"config.json: {BATCH_KEY} must be >= 1, got {value}")
    return int(value)


class SnacNode(NodeSubmodule):
    def __init__(self, snac_config: dict[str, Any], batch: int = 1) -> None:
        super().__init__()
        if batch < 1:
            raise ValueError(f"SNAC batch must be >= 1, got {batch}")
        self.batch = batch
        self.snac_cfg = SnacConfig.from_dict(snac_config)
        if len(self.snac_cfg.vq_strides) != 3:
            raise ValueError(f"Orpheus frames need a 3-level SNAC, got vq_strides {self.snac_cfg.vq_strides}")
        self.snac = SnacDecoder(self.snac_cfg)
        # One frame = one level-0 code = vq_strides[0] latent steps of hop_length samples.
        self.emit = emitted_samples(self.snac_cfg.hop_length * self.snac_cfg.vq_strides[0])

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Batch size changes conv kernels' rounding: only fixed-size calls keep a seeded
        # request's audio byte-identical whatever else is running (see decode_windows).
        return self.batch > 1

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        window = torch.as_tensor(signals["code_window"]).reshape(-1).to(torch.long)
        if window.numel() != WINDOW_CODES:
            raise ValueError(f"a SNAC window holds {WINDOW_CODES} codes, got {window.numel()}")
        return NodeInputs(tensor_inputs={"window": window}, input_seq_len=WINDOW_CODES)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.snac.decoder.model[0].weight.device
        return {"windows": torch.stack([i.tensor_inputs["window"] for i in inputs]).to(device)}

    def decode_windows(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 28] codes -> ([B, samples] the emitted samples, [B] window valid), in calls
        of exactly ``self.batch`` rows."""
        valid = valid_windows(windows, self.snac_cfg.codebook_size)
        safe = torch.where(valid[:, None], windows, 0)  # invalid windows decode zeros, then drop
        rows = safe.shape[0]
        padded = torch.cat([safe, safe.new_zeros(-rows % self.batch, safe.shape[1])])
        audio = torch.cat([self._decode(run) for run in padded.split(self.batch)])
        return audio[:rows], valid

    def _decode(self, windows: torch.Tensor) -> torch.Tensor:
        noise = CodeSeededNoise(window_seeds(windows)) if self.snac_cfg.noise else None
        return self.snac(window_levels(windows), noise)[:, 0, self.emit]

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, windows: torch.Tensor) -> BatchedModelOutput:
        keep = valid_windows(windows, self.snac_cfg.codebook_size).tolist()
        if not any(keep):  # nothing to emit (the official decoder skips such windows)
            return BatchedModelOutput()
        audio, _ = self.decode_windows(windows)
        return BatchedModelOutput(
            per_rid_outputs={rid: {"audio": audio[b]} for b, rid in enumerate(engine_inputs.request_ids) if keep[b]}
        )
