"""The Thinker's sparse MoE block: top-k softmax routing, then each expert runs once over
the tokens routed to it (tokens sorted by expert; results scattered back with index_add).

The experts run as two grouped matrix products over the sorted tokens (``torch._grouped_mm``,
no host sync), or, where that kernel is missing or the sizes break its 16-byte alignment, as
one product per expert that received tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from mstar.parallel.shard import split_parameter
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
        self.tensor_parallel: Any = None  # set by shard_tensor_parallel
        self.first_expert, self.local_experts = 0, num_experts  # expert parallelism: this rank's

    def shard_tensor_parallel(self, tp: Any) -> str:
        """Tensor parallelism (``mstar.parallel``): every rank routes alike (the router is
        whole) and the routed outputs are summed over the ranks in ``forward``. Each rank keeps
        its share of every expert's intermediate columns, or with ``tp.expert_parallel`` its
        E / N whole experts (computing only the assignments routed to them)."""
        if getattr(tp, "expert_parallel", False):
            part = self.num_experts // tp.size
            if part * tp.size != self.num_experts:
                raise ValueError(f"{self.num_experts} experts do not split over {tp.size} ranks")
            self.first_expert, self.local_experts = tp.rank * part, part
            mine = ((self.first_expert, self.first_expert + part),)
            split_parameter(self, "gate_up", self.gate_up, 0, mine)
            split_parameter(self, "down", self.down, 0, mine)
            self.tensor_parallel = tp
            return "mlp"
        part, a = self.intermediate // tp.size, tp.rank * (self.intermediate // tp.size)
        if part * tp.size != self.intermediate:
            raise ValueError(f"moe intermediate size {self.intermediate} does not split over {tp.size} ranks")
        i = self.intermediate  # split_parameter records the spans: a rank reads only its part
        split_parameter(self, "gate_up", self.gate_up, 1, ((a, a + part), (i + a, i + a + part)))
        split_parameter(self, "down", self.down, 2, ((a, a + part),))
        self.intermediate, self.tensor_parallel = part, tp
        return "mlp"

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, H] -> (expert ids [T, k], weights [T, k] in x's dtype)."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        flat, scales = experts.reshape(-1), weights.reshape(-1)
        assignment = None  # which (token, k) assignments this rank computes: all of them
        if self.local_experts != self.num_experts:  # expert parallelism: those of its experts
            local = flat - self.first_expert
            assignment = ((local >= 0) & (local < self.local_experts)).nonzero().squeeze(1)
            flat, scales = local.index_select(0, assignment), scales.index_select(0, assignment)
        result = torch.zeros_like(x)
        if flat.numel():
            order = torch.argsort(flat, stable=True)
            token = (order if assignment is None else assignment.index_select(0, order)) // self.top_k
            routed = x.index_select(0, token)
            counts = torch.bincount(flat, minlength=self.local_experts)
            out = self._grouped(routed, counts) if self._use_grouped(x) else self._per_expert(routed, counts)
            result.index_add_(0, token, out * scales.index_select(0, order)[:, None])
        return result if self.tensor_parallel is None else self.tensor_parallel.all_reduce(result)

    def _use_grouped(self, x: torch.Tensor) -> bool:
        aligned = all((n * x.element_size()) % 16 == 0 for n in (x.shape[-1], self.intermediate))
        return aligned and hasattr(torch, "_grouped_mm") and x.dtype == self.gate_up.dtype

    def _grouped(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ends = torch.cumsum(counts, 0).to(torch.int32)
        gate, up = torch._grouped_mm(routed, self.gate_up.transpose(1, 2), offs=ends).chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(gate) * up, self.down.transpose(1, 2), offs=ends)

    def _per_expert(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(routed)
        start = 0
        for e, n in enumerate(counts.tolist()):  # one host sync per block
            if n:
                gate, up = F.linear(routed[start : start + n], self.gate_up[e]).chunk(2, dim=-1)
                out[start : start + n] = F.linear(F.silu(gate) * up, self.down[e])
                start += n
        return out
