"""The Talker's MoE block: the Thinker's sparse experts (``moe.SparseMoeBlock``: top-k
softmax routing, each expert run once over its tokens) plus a shared expert that every token
passes through, scaled by a per-token sigmoid gate. Checkpoint keys: ``gate.weight``,
``experts.{e}.{gate,up,down}_proj.weight`` (stacked on load, see ``checkpoint_keys.EXPERTS``),
``shared_expert.{gate,up,down}_proj.weight``, ``shared_expert_gate.weight``."""

from __future__ import annotations

import torch
from mstar.layers import GatedMLP
from torch import nn

from mstar_qwen3omni.moe import SparseMoeBlock


class SharedExpertMoeBlock(SparseMoeBlock):
    def __init__(
        self, hidden: int, intermediate: int, num_experts: int, top_k: int, norm_topk_prob: bool, shared_intermediate: int
    ) -> None:
        super().__init__(hidden, intermediate, num_experts, top_k, norm_topk_prob)
        self.shared_expert = GatedMLP(hidden, shared_intermediate)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared
