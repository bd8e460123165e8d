"""The toy "decoder": (token, residual) codes → float audio, with a causal convolution so a
chunk needs left context to match a whole decode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from mstar.model.submodule_base import (
    BatchedModelOutput,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
)
from torch import nn


class ToyDecoder(NodeSubmodule):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        d = cfg["decoder"]
        c = d["hidden_size"]
        self.kernel = d["kernel_size"]
        self.token_embed = nn.Embedding(cfg["vocab_size"], c)
        self.residual_embed = nn.Embedding(cfg["residual_codes"], c)
        self.conv = nn.Conv1d(c, c, self.kernel)
        self.out = nn.Linear(c, d["samples_per_token"])

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Padding and batch size change the conv/matmul kernels' rounding; decoding each
        # chunk alone keeps a seeded request's audio byte-identical whatever else runs.
        return False

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        codes = signals["code_chunk"].reshape(-1, 2).to(torch.long)
        context = int(signals["code_context"]) if "code_context" in signals else 0
        return NodeInputs(tensor_inputs={"codes": codes}, kwargs={"context": context}, input_seq_len=codes.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        lengths = [i.input_seq_len for i in inputs]
        codes = torch.zeros(len(inputs), max(lengths), 2, dtype=torch.long)
        for b, i in enumerate(inputs):  # per chunk, not per token
            codes[b, : lengths[b]] = i.tensor_inputs["codes"]
        device = self.out.weight.device
        return {"codes": codes.to(device), "lengths": lengths, "contexts": [i.kwargs["context"] for i in inputs]}

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, n, 2] codes → [B, n, samples_per_token] audio."""
        x = self.token_embed(codes[..., 0]) + self.residual_embed(codes[..., 1])
        x = F.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # causal: output t sees t-k+1..t
        x = torch.tanh(self.conv(x)).transpose(1, 2)
        return torch.tanh(self.out(x))

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, codes: torch.Tensor, lengths: list[int], contexts: list[int]) -> BatchedModelOutput:
        audio = self.decode(codes)
        per_rid = {
            rid: {"audio": audio[b, contexts[b] : lengths[b]].reshape(-1)}
            for b, rid in enumerate(engine_inputs.request_ids)
        }
        return BatchedModelOutput(per_rid_outputs=per_rid)
