"""The toy LM: a small Llama-style decoder on M*'s paged KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from mstar.layers import RMSNorm, apply_rope
from mstar.model.submodule_base import (
    ARNodeInputs,
    ARNodeSubmodule,
    BatchedModelOutput,
    CurrentForwardPassInfo,
    KVCacheLayout,
    ModelInputsFromEngine,
)
from torch import nn

AUX_LABEL = "residual"
# Logprob signals (mstar.api.adapter's convention): the chosen token's logprob [B, 1] and
# the top-N alternatives [B, N].
LOGPROB, TOP_IDS, TOP_VALUES = "logprob", "top_logprob_ids", "top_logprob_values"
LOGPROB_SIGNALS = (LOGPROB, TOP_IDS, TOP_VALUES)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = h // self.n_heads
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: Any, layer: int) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.n_kv, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        return self.o_proj(attn.run(layer, q, k, v).reshape(t, -1))


class Block(nn.Module):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_norm = RMSNorm(h, eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(h, eps)
        self.gate_proj = nn.Linear(h, cfg["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(h, cfg["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(cfg["intermediate_size"], h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: Any, layer: int) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, attn, layer)
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class ToyLM(ARNodeSubmodule):
    """Node ``lm``. Each step samples a byte token (main sampler) and, conditioned on it, a
    residual code (auxiliary label ``residual``), like a code predictor."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        h = cfg["hidden_size"]
        self.embed = nn.Embedding(cfg["vocab_size"], h)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.head = nn.Linear(h, cfg["vocab_size"], bias=False)
        self.aux_embed = nn.Embedding(cfg["vocab_size"], h)
        self.aux_head = nn.Linear(h, cfg["residual_codes"], bias=False)
        self.head_dim = h // cfg["num_attention_heads"]
        self.eos_token_id = cfg["eos_token_id"]

    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.cfg["num_hidden_layers"], self.cfg["num_key_value_heads"], self.head_dim)

    def max_model_len(self) -> int:
        return self.cfg["max_position_embeddings"]

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        if graph_walk != "prefill":  # the token this node sampled last step: in range by construction
            ids = signals["token"]
            # Per row and step: skip the no-op reshape/.to() (each still a dispatch) when the
            # sampled token already is a 1-D long tensor.
            if ids.dim() != 1 or ids.dtype != torch.long:
                ids = ids.reshape(-1).to(torch.long)
            return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())
        ids = signals["prompt_ids"].reshape(-1).to(torch.long)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(ids.max()) >= self.cfg["vocab_size"] or int(ids.min()) < 0:
            raise ValueError(f"token ids must lie in [0, {self.cfg['vocab_size']})")
        return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.embed.weight.device
        return {"input_ids": torch.cat([i.input_ids for i in inputs]).to(device)}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, input_ids: torch.Tensor) -> BatchedModelOutput:
        hidden = self.hidden_states(input_ids, engine_inputs)
        assert engine_inputs.qo_indptr is not None
        # One token per row (decode): every token is its row's last, so no index and copy.
        one_per_row = hidden.shape[0] == engine_inputs.qo_indptr.shape[0] - 1
        last = hidden if one_per_row else hidden[engine_inputs.last_token_index.long()]
        out = engine_inputs.run_region("head", self.sample_head, {"hidden": last})
        codes = torch.stack([out["token"], out["residual"]], dim=-1)
        rows = {"token": out["token"][:, None], "codes": codes[:, None, :]}
        # Only when a row asked: an output per row and step costs every request.
        if any(i.sampling is not None and i.sampling.logprobs for i in engine_inputs.per_request_info.values()):
            rows[LOGPROB] = out[LOGPROB][:, None]
            if TOP_IDS in out:
                rows[TOP_IDS], rows[TOP_VALUES] = out[TOP_IDS], out[TOP_VALUES]
        return BatchedModelOutput(row_outputs=rows)

    def hidden_states(self, input_ids: torch.Tensor, engine_inputs: ModelInputsFromEngine) -> torch.Tensor:
        assert engine_inputs.positions is not None
        x = self.embed(input_ids)
        # Angles in float32, applied in the model's dtype (as HF's rotary embeddings do).
        cos, sin = (t.to(x.dtype) for t in rope(engine_inputs.positions, self.head_dim, self.cfg["rope_theta"]))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, engine_inputs.attention, i)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))

    def sample_head(self, static_inputs: dict[str, torch.Tensor], sampler: Any) -> dict[str, torch.Tensor]:
        """The region the piecewise runner may capture: head, main sample, aux sample."""
        h = self.norm(static_inputs["hidden"])
        main = sampler.sample(self.head(h))
        token = main.tokens
        residual = sampler.sample_aux(AUX_LABEL, self.aux_head(h + self.aux_embed(token))).tokens
        out = {"token": token, "residual": residual, LOGPROB: main.logprobs}
        if main.top_logprob_ids is not None:  # some registered request asked for top logprobs
            out[TOP_IDS], out[TOP_VALUES] = main.top_logprob_ids, main.top_logprob_values
        return out
