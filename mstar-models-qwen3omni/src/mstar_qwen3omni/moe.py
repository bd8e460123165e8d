"""The Thinker's sparse MoE block: top-k softmax routing, then each expert runs once over
the tokens routed to it (tokens sorted by expert; results scattered back with index_add)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SparseMoeBlock(nn.Module):
    """Checkpoint keys ``gate.weight`` and ``experts.{e}.{gate,up,down}_proj.weight`` are
    loaded into the stacked ``gate_up`` [E, 2I, H] and ``down`` [E, H, I] (see weights.py)."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.intermediate = intermediate
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, H] -> (expert ids [T, k], weights [T, k] in x's dtype)."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k  # the token of each (sorted) assignment
        routed = x.index_select(0, token)
        scale = weights.reshape(-1).index_select(0, order)[:, None]
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # one host sync per block
        out = torch.empty_like(routed)
        start = 0
        for e, n in enumerate(counts):
            if n:
                h = routed[start : start + n]
                gate, up = F.linear(h, self.gate_up[e]).chunk(2, dim=-1)
                out[start : start + n] = F.linear(F.silu(gate) * up, self.down[e])
                start += n
        result = torch.zeros_like(x)
        return result.index_add_(0, token, out * scale)
