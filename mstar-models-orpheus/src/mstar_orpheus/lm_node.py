"""Node ``lm``: the Llama backbone as an ``ARNodeSubmodule`` that samples the next token
and turns audio tokens into SNAC codes for the ``code`` stream (withholding the rest)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.layers import vocab_logits
from mstar.model.submodule_base import (
    ARNodeInputs,
    ARNodeSubmodule,
    BatchedModelOutput,
    BatchedStopCheck,
    CurrentForwardPassInfo,
    KVCacheLayout,
    ModelInputsFromEngine,
    StopCheck,
)
from torch import nn

from mstar_orpheus.audio_codes import tokens_to_codes
from mstar_orpheus.config import head_dim
from mstar_orpheus.llama import LlamaModel
from mstar_orpheus.tokens import OrpheusTokens

AUDIO_COUNT = "audio_tokens"  # per-request state: accepted audio tokens so far


class OrpheusLM(ARNodeSubmodule):
    def __init__(self, cfg: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.vocab_size = int(cfg["vocab_size"])
        self.tokens = OrpheusTokens.from_dict(cfg["orpheus"])
        self.codebook_size = int(cfg["snac"].get("codebook_size", 4096))
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.model = LlamaModel(cfg)
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], self.vocab_size, bias=False)

    # ---- contract ----------------------------------------------------------------------
    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.cfg["num_hidden_layers"], self.cfg["num_key_value_heads"], head_dim(self.cfg), self.dtype)

    def max_model_len(self) -> int:
        return int(self.cfg["max_position_embeddings"])

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        ids = signals["prompt_ids"] if info.walk == "prefill" else signals["token"]
        ids = torch.as_tensor(ids).reshape(-1).to(torch.long)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.model.embed_tokens.weight.device
        states = engine_inputs.per_request_states
        counts = [states[rid].get(AUDIO_COUNT, 0) if rid in states else 0 for rid in engine_inputs.request_ids]
        return {
            "input_ids": torch.cat([i.input_ids for i in inputs]).to(device),
            "audio_count": torch.tensor(counts, dtype=torch.long, device=device),
        }

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, input_ids: torch.Tensor, audio_count: torch.Tensor
    ) -> BatchedModelOutput:
        assert engine_inputs.positions is not None
        hidden = self.model(input_ids, engine_inputs.positions.to(input_ids.device), engine_inputs.attention)
        last = hidden[engine_inputs.last_token_index.long()]
        out = engine_inputs.run_region("head", self.sample_head, {"hidden": last})
        token = out["token"]
        code, accepted = tokens_to_codes(token, audio_count, self.tokens.custom_token_base, self.codebook_size)
        self._advance_audio_counts(engine_inputs, (audio_count + accepted.long()).tolist())
        return BatchedModelOutput(
            row_outputs={"token": token[:, None], "code": code[:, None], "is_audio": accepted[:, None]},
        )

    def check_stop_batched(
        self, request_ids: list[str], infos: list[CurrentForwardPassInfo], outputs: BatchedModelOutput
    ) -> BatchedStopCheck:
        # Core applies max_tokens and the stop ids; only accepted audio codes enter the stream.
        audio = outputs.row_outputs["is_audio"][:, 0].tolist()
        return BatchedStopCheck({rid: StopCheck(withheld=("code",)) for rid, ok in zip(request_ids, audio, strict=True) if not ok})

    # ---- pieces ------------------------------------------------------------------------
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.model.norm(hidden)
        return vocab_logits(h, self.model.embed_tokens.weight if self.tied else self.lm_head.weight)

    def sample_head(self, static_inputs: dict[str, torch.Tensor], sampler: Any) -> dict[str, torch.Tensor]:
        """The region a piecewise runner may capture: final norm, LM head, sampling."""
        logits = self.logits(static_inputs["hidden"])
        return {"token": sampler.sample(logits).tokens}

    def _advance_audio_counts(self, engine_inputs: ModelInputsFromEngine, counts: list[int]) -> None:
        # Only a step that completes (not a prefill chunk or cache replay) produced a token.
        for rid, count in zip(engine_inputs.request_ids, counts, strict=True):
            if engine_inputs.per_request_info[rid].is_last_chunk and rid in engine_inputs.per_request_states:
                engine_inputs.per_request_states[rid].add(AUDIO_COUNT, count)

    def init_random(self, std: float) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)
