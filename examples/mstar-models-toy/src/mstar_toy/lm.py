"""The toy LM: a small Llama-style decoder on M*'s paged KV cache, built from
``mstar.layers``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.layers import GatedMLP, PagedSelfAttention, RMSNorm, RotaryEmbedding, head_dim_of
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


class Block(GatedMLP):
    """A pre-norm decoder block. The toy's checkpoints keep the MLP's projections on the
    block itself (``layers.N.gate_proj``), so the block is the ``GatedMLP`` and adds the
    norms and attention (``input_norm``, ``attn``, ``post_norm``)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.attn = PagedSelfAttention.from_config(cfg)
        self.post_norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: Any, layer: int) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, attn, layer)
        return x + super().forward(self.post_norm(x))


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
        self.head_dim = head_dim_of(cfg)
        self.rope = RotaryEmbedding.from_config(cfg, self.head_dim)
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
        cos, sin = self.rope(engine_inputs.positions, x.dtype)
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
