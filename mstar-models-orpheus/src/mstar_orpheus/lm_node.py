"""Node ``lm``: the Llama backbone (``mstar.layers.DecoderModel``, HF's key names) as a
``CausalLMNode`` that samples the next token and turns audio tokens into SNAC codes for the
``code`` stream (withholding the rest)."""

from __future__ import annotations

from typing import Any

import torch
from mstar.layers import DecoderModel, vocab_logits
from mstar.model.submodule_base import (
    BatchedModelOutput,
    BatchedStopCheck,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    StopCheck,
)
from mstar.text.lm import CausalLMNode
from torch import nn

from mstar_orpheus.audio_codes import tokens_to_codes
from mstar_orpheus.tokens import OrpheusTokens

AUDIO_COUNT = "audio_tokens"  # per-request state: accepted audio tokens so far


class OrpheusLM(CausalLMNode):
    token_signal = "token"

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.tokens = OrpheusTokens.from_dict(cfg["orpheus"])
        self.codebook_size = int(cfg["snac"].get("codebook_size", 4096))
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r} (Llama uses silu)")
        self.model = DecoderModel(cfg)
        if not self.tied:  # a tied head has no key of its own in Orpheus' checkpoints
            self.lm_head = nn.Linear(cfg["hidden_size"], self.vocab_size, bias=False)

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        out = super().preprocess(graph_walk, engine_inputs, inputs)
        states = engine_inputs.per_request_states
        counts = [states[rid].get(AUDIO_COUNT, 0) if rid in states else 0 for rid in engine_inputs.request_ids]
        out["audio_count"] = torch.tensor(counts, dtype=torch.long, device=out["input_ids"].device)
        return out

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, input_ids: torch.Tensor, audio_count: torch.Tensor
    ) -> BatchedModelOutput:
        assert engine_inputs.positions is not None
        hidden = self.hidden_states(input_ids, engine_inputs.positions.to(input_ids.device), engine_inputs.attention)
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
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Any) -> torch.Tensor:
        return self.model(input_ids, positions, attention)

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
