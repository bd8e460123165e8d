"""Node ``codec``: decodes chunks of the talker's code stream to audio (stateless).

Each chunk arrives with left-context frames already decoded before; their audio is dropped,
so with enough context the chunk's new audio equals that of one whole decode.
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

from mstar_qwen3tts.codec_decoder import CodecDecoder
from mstar_qwen3tts.config import CodecConfig


class CodecNode(NodeSubmodule):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = CodecDecoder(cfg)

    def get_autocast_dtype(self) -> torch.dtype:
        return torch.float32

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Batch shape changes conv/matmul rounding; one chunk at a time keeps a seeded
        # request's audio byte-identical whatever else the server is doing.
        return False

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        codes = signals["code_chunk"].reshape(-1, self.cfg.num_quantizers).to(torch.long)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codec codes must lie in [0, {self.cfg.codebook_size})")
        context = int(signals["code_context"]) if "code_context" in signals else 0
        return NodeInputs(tensor_inputs={"codes": codes}, kwargs={"context": context}, input_seq_len=codes.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.decoder.pre_conv.conv.weight.device
        return {
            "codes": [i.tensor_inputs["codes"].to(device) for i in inputs],
            "contexts": [i.kwargs["context"] for i in inputs],
        }

    def decode(self, codes: torch.Tensor, context: int = 0) -> torch.Tensor:
        """Frames [T, G] → audio samples of frames ``context``..T-1 (float32, 1-D)."""
        wav = self.decoder(codes.T[None])
        return wav[0, 0, context * self.decoder.samples_per_frame :]

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, codes: list[torch.Tensor], contexts: list[int]
    ) -> BatchedModelOutput:
        per_rid = {
            rid: {"audio": self.decode(c, ctx)}
            for rid, c, ctx in zip(engine_inputs.request_ids, codes, contexts, strict=True)
        }
        return BatchedModelOutput(per_rid_outputs=per_rid)
