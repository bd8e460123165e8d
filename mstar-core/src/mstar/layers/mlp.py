"""The gated feed-forward block of Llama-family models: ``down(act(gate(x)) * up(x))``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class GatedMLP(nn.Module):
    """Parameters ``gate_proj``, ``up_proj``, ``down_proj`` (HF's names), or with
    ``fused_gate_up`` one ``gate_up_proj`` whose output is gate then up (Phi-3)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, act: str = "silu", bias: bool = False, *, fused_gate_up: bool = False
    ) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unsupported activation {act!r} (supported: {sorted(ACTIVATIONS)})")
        self.act = ACTIVATIONS[act]
        if fused_gate_up:
            self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        else:
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, fused_gate_up: bool = False) -> GatedMLP:
        """From HF config keys ``hidden_size``, ``intermediate_size``, ``hidden_act``, ``mlp_bias``."""
        return cls(
            config["hidden_size"],
            config["intermediate_size"],
            config.get("hidden_act", "silu"),
            bool(config.get("mlp_bias", False)),
            fused_gate_up=fused_gate_up,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., H]."""
        if "gate_up_proj" in self._modules:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)
