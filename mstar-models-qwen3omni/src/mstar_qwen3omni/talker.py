"""Node ``talker``: the Qwen3-Omni Talker, a MoE codec LM on M*'s paged KV cache.

Each step it reads one input embedding per new position, runs the decoder (QK-norm GQA
attention with interleaved M-RoPE; every layer a sparse MoE with a sigmoid-gated shared
expert, as transformers builds it whatever ``mlp_only_layers`` says), and from the last
position's normed state samples a frame: code 0 from ``codec_head`` with the main sampler
(the top 1024 ids except codec EOS suppressed, as transformers' generate does), then codes
1..G-1 with the code predictor under the auxiliary label ``code_predictor`` (the piecewise
region ``PIECEWISE_LABEL``). Outputs per row: ``codes`` [1, G] and ``frame_embed`` [1, H],
the sum of the frame's code embeddings.

Signals (one row = one request):

- prefill walks (``prefill_walks``, default ``("prefill",)``): ``talker_prompt_embeds`` [n, H],
  the prefill already in Talker width (``talker_prompt.build_talker_prompt`` makes it from the
  Thinker's outputs); optionally ``talker_positions`` [3, n] M-RoPE positions
  (``talker_prompt.talker_positions`` for media requests; default 0..n-1 on every axis).
  Or, fed from the Thinker's streams (the engine graph): ``talker_prompt_rows`` [1, n0, Ht]
  (``thinker_node.TALKER_PROMPT``: the Thinker's rows over its prompt ``prompt_ids``) and
  ``thinker_text_embed`` [1, Ht], the embedding of the Thinker's first generated token; the
  node builds the prefill (``build_talker_prompt``, voice from request kwarg ``voice``) and
  its M-RoPE positions (from the request's media grids) itself.
- other walks (one frame per step): ``frame_embed`` [1, H] from the previous step and
  ``thinker_text_embed`` [Ht], the Thinker-width embedding of this step's text (which one:
  ``talker_prompt.step_text``: Thinker tokens from the second on, then ``tts_eos``, then
  ``tts_pad``); the input is
  ``frame_embed + text_projection(thinker_text_embed)``. An empty ``thinker_text_embed``
  (the Thinker's stream has ended) with ``thinker_text_ended`` = k means ``tts_eos`` for
  k = 0, ``tts_pad`` after; the node holds those Thinker embeddings (``tts_embeds``).

The network is ``talker_lm.TalkerLM`` (module names follow the checkpoint's ``talker.*``
keys); ``TalkerLM.hidden_states`` runs the same decoder outside the engine on a
``DenseKVCache``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.model.submodule_base import (
    STOP_ALL,
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

from mstar_qwen3omni.config import MultimodalTokens
from mstar_qwen3omni.talker_config import TalkerConfig
from mstar_qwen3omni.talker_lm import CODES, FRAME_EMBED, TalkerLM
from mstar_qwen3omni.talker_prompt import build_talker_prompt, talker_positions

PIECEWISE_LABEL = "code_predictor"
PREFILL = "prefill"
PROMPT_EMBEDS, POSITIONS = "talker_prompt_embeds", "talker_positions"
TEXT_EMBED = "thinker_text_embed"
PROMPT_ROWS, TEXT_ENDED = "talker_prompt_rows", "thinker_text_ended"
THINKER_PROMPT = "prompt_ids"  # the request's Thinker prompt
VOICE = "voice"  # request kwarg
SILENT = "silent"  # a prefill with nothing to speak: the Talker stops at once
ROPE_DELTA = "talker_rope_delta"
# transformers' generate(return_audio=True) defaults for code 0 (talker_* kwargs); the stop id
# is the config's codec_eos_token_id. The residual codes: code_predictor.AUX_SAMPLING_DEFAULTS.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "max_tokens": 4096,
}


class TalkerNode(ARNodeSubmodule):
    def __init__(self, config: dict[str, Any], dtype: torch.dtype = torch.float32, prefill_walks: tuple[str, ...] = (PREFILL,)) -> None:
        super().__init__()
        self.cfg = TalkerConfig.from_config(config)
        self.dtype = dtype
        self.prefill_walks = prefill_walks
        self.config = config
        self.lm = TalkerLM(self.cfg)
        # The Thinker's input embeddings of tts_bos, tts_eos, tts_pad (the factory fills them
        # from the checkpoint's Thinker table).
        self.register_buffer("tts_embeds", torch.zeros(3, self.cfg.thinker_hidden_size), persistent=False)

    def default_voice(self) -> str:
        """transformers' default speaker when the checkpoint lists it, else its first."""
        if not self.cfg.speakers:
            raise ValueError("the checkpoint's talker_config lists no speakers")
        return "ethan" if "ethan" in self.cfg.speakers else next(iter(self.cfg.speakers))

    # ---- contract ----------------------------------------------------------------------
    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim, self.dtype)

    def max_model_len(self) -> int:
        return self.cfg.max_position_embeddings

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        h = self.cfg.hidden_size
        if info.walk in self.prefill_walks and PROMPT_ROWS in signals:
            return self._streamed_prefill(info, signals)
        if info.walk in self.prefill_walks:
            embeds = torch.as_tensor(signals[PROMPT_EMBEDS])
            if embeds.ndim != 2 or embeds.shape[1] != h or embeds.shape[0] == 0:
                raise ValueError(f"{PROMPT_EMBEDS} must be [n >= 1, {h}], got {list(embeds.shape)}")
            positions = signals.get(POSITIONS)
            if positions is None:
                return ARNodeInputs(input_embeds=embeds, input_seq_len=embeds.shape[0])
            positions = torch.as_tensor(positions).to(torch.float32)
            if positions.shape != (3, embeds.shape[0]):
                raise ValueError(f"{POSITIONS} must be [3, {embeds.shape[0]}], got {list(positions.shape)}")
            delta = float(positions.max()) + 1 - embeds.shape[0]
            return ARNodeInputs(
                input_embeds=embeds, custom_pos_ids=positions, input_seq_len=embeds.shape[0], kwargs={ROPE_DELTA: delta}
            )
        frame = torch.as_tensor(signals[FRAME_EMBED]).reshape(1, h)
        text = torch.as_tensor(signals[TEXT_EMBED])
        if not text.numel():  # the Thinker's text has ended: tts_eos once, then tts_pad
            ended = signals.get(TEXT_ENDED)
            if ended is None:
                raise ValueError(f"an empty {TEXT_EMBED} needs {TEXT_ENDED}")
            text = self.tts_embeds[1 if int(ended) == 0 else 2]
        text = text.reshape(1, self.cfg.thinker_hidden_size)
        # The whole input embedding is built here, so the row's inputs stand alone (a cache
        # recompute or a chunked prefill replays them without other state).
        weight = self.lm.text_projection.linear_fc1.weight
        with torch.inference_mode():
            embed = frame.to(weight.device, weight.dtype) + self.lm.text_projection(text.to(weight.device, weight.dtype))
        return ARNodeInputs(input_embeds=embed, input_seq_len=1)

    def _streamed_prefill(self, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        ht = self.cfg.thinker_hidden_size
        rows = torch.as_tensor(signals[PROMPT_ROWS]).reshape(-1, ht)
        first = torch.as_tensor(signals[TEXT_EMBED]).reshape(-1, ht)
        if not first.shape[0]:
            # The Thinker ended at its first token: nothing to speak (transformers fails
            # here). One placeholder position runs and the Talker stops without a frame.
            return ARNodeInputs(input_embeds=torch.zeros(1, self.cfg.hidden_size), input_seq_len=1, kwargs={SILENT: True})
        ids = torch.as_tensor(signals[THINKER_PROMPT]).reshape(-1)
        if ids.numel() != rows.shape[0]:
            raise ValueError(f"{PROMPT_ROWS} has {rows.shape[0]} rows for a prompt of {ids.numel()} tokens")
        voice = info.request_kwargs.get(VOICE) or self.default_voice()
        mm = MultimodalTokens.from_config(self.config)
        media_ids = (mm.audio_token_id, mm.image_token_id, mm.video_token_id)
        with torch.inference_mode():
            prompt = build_talker_prompt(
                self.lm, ids, torch.cat([rows, first]), rows, self.tts_embeds, str(voice), media_ids
            )
        mask = signals.get("feature_attention_mask")
        lengths = signals.get("audio_feature_lengths")
        if lengths is None and mask is not None:
            lengths = torch.as_tensor(mask).sum(-1)
        placed = talker_positions(
            prompt, self.config, image_grid_thw=signals.get("image_grid_thw"), video_grid_thw=signals.get("video_grid_thw"),
            video_second_per_grid=signals.get("video_second_per_grid"), audio_feature_lengths=lengths,
        )
        embeds = prompt.embeds.cpu()
        if placed is None:
            return ARNodeInputs(input_embeds=embeds, input_seq_len=embeds.shape[0])
        positions, delta = placed
        return ARNodeInputs(
            input_embeds=embeds, custom_pos_ids=positions.to(torch.float32), input_seq_len=embeds.shape[0],
            kwargs={ROPE_DELTA: float(delta)},
        )

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.lm.codec_head.weight.device
        assert engine_inputs.positions is not None and engine_inputs.qo_indptr is not None
        states = engine_inputs.per_request_states
        deltas = []
        for rid, inp in zip(engine_inputs.request_ids, inputs, strict=True):
            if ROPE_DELTA in inp.kwargs and rid in states:
                states[rid].add(ROPE_DELTA, inp.kwargs[ROPE_DELTA])
            deltas.append(float(states[rid].get(ROPE_DELTA, 0.0)) if rid in states else 0.0)
        counts = torch.tensor([i.input_seq_len for i in inputs])
        pos = engine_inputs.positions.to(torch.float32).cpu() + torch.tensor(deltas).repeat_interleave(counts)
        positions = pos.expand(3, -1).clone()
        starts = engine_inputs.qo_indptr[:-1].tolist()
        for start, inp in zip(starts, inputs, strict=True):
            if inp.custom_pos_ids is not None:
                positions[:, start : start + inp.input_seq_len] = inp.custom_pos_ids.to(torch.float32)
        return {
            "input_embeds": torch.cat([i.input_embeds for i in inputs]).to(device=device, dtype=self.dtype),
            "positions": positions.to(device),
            "silent": torch.tensor([bool(i.kwargs.get(SILENT)) for i in inputs]),
        }

    def forward_batched(
        self,
        graph_walk: str,
        engine_inputs: ModelInputsFromEngine,
        input_embeds: torch.Tensor,
        positions: torch.Tensor,
        silent: torch.Tensor | None = None,
    ) -> BatchedModelOutput:
        hidden = self.lm.hidden_states(input_embeds, positions, engine_inputs.attention)[engine_inputs.last_token_index.long()]
        region = {"hidden": hidden, "logits": self.lm.codec_logits(hidden)}
        runner = engine_inputs.piecewise_runners.get(PIECEWISE_LABEL)
        out = runner(region) if runner is not None else self.lm.sample_frame(region, engine_inputs.sampler)
        rows = {CODES: out[CODES][:, None, :], FRAME_EMBED: out[FRAME_EMBED][:, None, :]}
        if silent is not None and bool(silent.any()):
            rows[SILENT] = silent
        return BatchedModelOutput(row_outputs=rows)

    def check_stop_batched(
        self, request_ids: list[str], infos: list[CurrentForwardPassInfo], outputs: BatchedModelOutput
    ) -> BatchedStopCheck:
        # Core applies max_tokens and stop ids; a codec-EOS frame carries no audio, and (as
        # transformers) the frame drawn at max_tokens is dropped: its stop ends the Talker.
        firsts = outputs.row_outputs[CODES][:, 0, 0].tolist()
        silent = outputs.row_outputs.get(SILENT)
        eos = self.cfg.codec_eos_id
        checks = {}
        for i, (rid, info, tok) in enumerate(zip(request_ids, infos, firsts, strict=True)):
            last = info.sampling is not None and info.num_generated + 1 >= info.sampling.max_tokens
            if silent is not None and bool(silent[i]):
                checks[rid] = StopCheck(frozenset({STOP_ALL}), (CODES, FRAME_EMBED))
            elif tok == eos or last:
                checks[rid] = StopCheck(withheld=(CODES,))
        return BatchedStopCheck(checks)

    def init_random(self, std: float) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)
