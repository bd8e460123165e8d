"""Node ``thinker``: the Thinker LLM as an ``ARNodeSubmodule``. The prefill places encoder
outputs on their placeholder tokens and uses the prompt's M-RoPE positions; every step
samples the next token with the batch's sampler (``mstar.text.lm``'s signals).

Rows of the speech walks (``SPEECH_PREFILL`` / ``SPEECH_DECODE``, checkpoints with a Talker)
also give what the Talker reads (``talker_prompt``'s docstring): a speech prefill, once its
last chunk ran, ``TALKER_PROMPT`` [1, n, H]: per prompt position the input embedding, or at
audio/image/video placeholders the state after ``accept_hidden_layer`` layers (kept across
prefill chunks in the request's state); every row ``THINKER_EMBED`` [1, H], the input
embedding of its last position (for a decode row: the token fed back)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import torch
from mstar.model.digest import tensor_digest
from mstar.model.submodule_base import (
    ARNodeInputs,
    ARNodeSubmodule,
    BatchedModelOutput,
    CurrentForwardPassInfo,
    KVCacheLayout,
    ModelInputsFromEngine,
)
from mstar.text.lm import PREFILL, PROMPT, TOKENS, sample_step
from torch import nn

from mstar_qwen3omni.config import MultimodalTokens, TextConfig, has_speech
from mstar_qwen3omni.positions import prompt_positions
from mstar_qwen3omni.text_model import ThinkerLM

ROPE_DELTA = "rope_delta"  # per-request state and prefill kwarg: decode position offset
# Prefill tensor inputs: encoder outputs by prompt row (``*_rows`` index the prompt).
MM_ROWS, MM_EMBEDS, DS_ROWS, DS_EMBEDS = "mm_rows", "mm_embeds", "ds_rows", "ds_embeds"
# Request signals the prefill reads when present: encoder outputs [n, H] (deepstack [L, n, H]).
IMAGE_EMBEDS, IMAGE_DEEPSTACK = "image_embeds", "image_deepstack"
VIDEO_EMBEDS, VIDEO_DEEPSTACK = "video_embeds", "video_deepstack"
AUDIO_EMBEDS = "audio_embeds"
SPEECH_PREFILL, SPEECH_DECODE = "speech_prefill", "speech_decode"
PREFILL_WALKS = (PREFILL, SPEECH_PREFILL)
TALKER_PROMPT, THINKER_EMBED = "talker_prompt", "thinker_embed"
PROMPT_ROWS = "talker_prompt_rows"  # per-request state: the speech prefill's rows so far


def _audio_lengths(signals: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """Mel frames per audio: given, or counted from the processor's feature mask."""
    if signals.get("audio_feature_lengths") is not None:
        return torch.as_tensor(signals["audio_feature_lengths"])
    mask = signals.get("feature_attention_mask")
    return None if mask is None else torch.as_tensor(mask).sum(-1)


class ThinkerNode(ARNodeSubmodule):
    def __init__(self, config: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.text = TextConfig.from_config(config)
        self.mm = MultimodalTokens.from_config(config)
        self.dtype = dtype
        self.lm = ThinkerLM(self.text)
        # The layer whose states the Talker reads at media placeholders (None: no Talker).
        self.accept_layer: int | None = int(config["talker_config"]["accept_hidden_layer"]) if has_speech(config) else None
        if self.accept_layer is not None and not 0 <= self.accept_layer <= self.text.num_layers:
            raise ValueError(f"accept_hidden_layer {self.accept_layer} outside [0, {self.text.num_layers}]")
        self.media_ids = (self.mm.audio_token_id, self.mm.image_token_id, self.mm.video_token_id)

    # ---- contract ----------------------------------------------------------------------
    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.text.num_layers, self.text.num_kv_heads, self.text.head_dim, self.dtype)

    def max_model_len(self) -> int:
        return self.text.max_position_embeddings

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        if info.walk not in PREFILL_WALKS:
            ids = torch.as_tensor(signals[TOKENS]).reshape(-1).to(torch.long)
            return ARNodeInputs(input_ids=ids, input_seq_len=ids.numel())
        ids = torch.as_tensor(signals[PROMPT]).reshape(-1).to(torch.long)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty")
        if int(ids.min()) < 0 or int(ids.max()) >= self.text.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.text.vocab_size})")
        positions, delta = prompt_positions(
            ids,
            self.mm,
            image_grid_thw=signals.get("image_grid_thw"),
            video_grid_thw=signals.get("video_grid_thw"),
            video_second_per_grid=signals.get("video_second_per_grid"),
            audio_feature_lengths=_audio_lengths(signals),
        )
        return ARNodeInputs(
            input_ids=ids,
            custom_pos_ids=positions,
            input_seq_len=ids.numel(),
            tensor_inputs=self._media_inputs(ids, signals),
            kwargs={ROPE_DELTA: delta},
        )

    def prefix_cache_keys(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs
    ) -> Sequence[Hashable] | None:
        """A position's identity: its token id while the prompt is plain text at positions
        0, 1, ... (as every decode row is: the token fed back at the next cache position);
        from the first media row or M-RoPE position off that line on, (token id, its three
        M-RoPE positions, a digest of all the prompt's media embeddings), so prompts with
        different media part there. Not shared: a spoken answer's prompt (the Talker reads
        the Thinker's states at every prompt position, so none may be skipped)."""
        if info.walk == SPEECH_PREFILL or inputs.input_embeds is not None or inputs.input_ids is None:
            return None
        ids = inputs.input_ids.reshape(-1).tolist()
        pos, media = inputs.custom_pos_ids, inputs.tensor_inputs
        if pos is None:
            return ids
        n = len(ids)
        off_line = (pos != torch.arange(n, dtype=pos.dtype)).any(0)
        firsts = [int(off_line.nonzero()[0])] if bool(off_line.any()) else []
        firsts += [int(media[k].min()) for k in (MM_ROWS, DS_ROWS) if k in media and media[k].numel()]
        first = min(firsts, default=n)
        if first == n:
            return ids
        digest = tensor_digest(*(media[k] for k in sorted(media)))
        triples = pos[:, first:].T.tolist()
        return [*ids[:first], *((t, *p, digest) for t, p in zip(ids[first:], triples, strict=True))]

    def split_inputs(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs, start: int, end: int
    ) -> ARNodeInputs:
        part = inputs.slice(start, end)
        t = inputs.tensor_inputs
        if not t:
            return part
        chunk: dict[str, torch.Tensor] = {}
        for rows_key, embeds_key, dim in ((MM_ROWS, MM_EMBEDS, 0), (DS_ROWS, DS_EMBEDS, 1)):
            if rows_key in t:
                keep = (t[rows_key] >= start) & (t[rows_key] < end)
                chunk[rows_key] = t[rows_key][keep] - start
                chunk[embeds_key] = t[embeds_key][:, keep] if dim else t[embeds_key][keep]
        part.tensor_inputs = chunk
        return part

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.lm.model.embed_tokens.weight.device
        assert engine_inputs.positions is not None and engine_inputs.qo_indptr is not None
        states = engine_inputs.per_request_states
        lengths = [i.input_seq_len for i in inputs]
        starts = [0, *accumulate(lengths)][:-1]  # the rows' offsets (qo_indptr) without a device sync
        deltas = []
        for rid, inp in zip(engine_inputs.request_ids, inputs, strict=True):
            if ROPE_DELTA in inp.kwargs and rid in states:
                states[rid].add(ROPE_DELTA, inp.kwargs[ROPE_DELTA])
            deltas.append(float(states[rid].get(ROPE_DELTA, 0.0)) if rid in states else 0.0)
        counts = torch.tensor(lengths, device=device)
        # Decode rows (and text): the cache position plus the request's rope delta, all axes
        # equal; built on the device (no host sync).
        delta = torch.tensor(deltas, dtype=torch.float32, device=device).repeat_interleave(counts, output_size=sum(lengths))
        positions = (engine_inputs.positions.to(device, torch.float32) + delta).expand(3, -1).clone()
        mm_rows, mm_embeds, ds_rows, ds_embeds = [], [], [], []
        for start, inp in zip(starts, inputs, strict=True):
            if inp.custom_pos_ids is not None:
                positions[:, start : start + inp.input_seq_len] = inp.custom_pos_ids.to(device, torch.float32)
            t = inp.tensor_inputs
            if MM_ROWS in t:
                mm_rows.append(t[MM_ROWS] + start)
                mm_embeds.append(t[MM_EMBEDS])
            if DS_ROWS in t:
                ds_rows.append(t[DS_ROWS] + start)
                ds_embeds.append(t[DS_EMBEDS])
        out: dict[str, Any] = {
            "input_ids": torch.cat([i.input_ids for i in inputs]).to(device),
            "positions": positions,
        }
        if mm_rows:
            out["mm_rows"] = torch.cat(mm_rows).to(device)
            out["mm_embeds"] = torch.cat(mm_embeds).to(device, self.dtype)
        if ds_rows:
            out["ds_rows"] = torch.cat(ds_rows).to(device)
            out["ds_embeds"] = list(torch.cat(ds_embeds, dim=1).to(device, self.dtype).unbind(0))
        return out

    def forward_batched(
        self,
        graph_walk: str,
        engine_inputs: ModelInputsFromEngine,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mm_rows: torch.Tensor | None = None,
        mm_embeds: torch.Tensor | None = None,
        ds_rows: torch.Tensor | None = None,
        ds_embeds: list[torch.Tensor] | None = None,
    ) -> BatchedModelOutput:
        embeds = self.lm.model.embed_tokens(input_ids)
        if mm_rows is not None and mm_embeds is not None and mm_rows.numel():
            embeds = embeds.index_copy(0, mm_rows, mm_embeds)
        if ds_rows is not None and not ds_rows.numel():
            ds_rows, ds_embeds = None, None
        infos = [engine_inputs.per_request_info[rid] for rid in engine_inputs.request_ids]
        speech = self.accept_layer is not None and any(i.walk in (SPEECH_PREFILL, SPEECH_DECODE) for i in infos)
        kept: list[torch.Tensor] | None = [] if speech else None
        hidden = self.lm.model(embeds, positions, engine_inputs.attention, ds_embeds, ds_rows, kept, self.accept_layer or 0)
        last = engine_inputs.last_token_index.long()
        # Tokens, logprobs and (for return_logits requests) logits, as mstar.text.lm defines them.
        out = sample_step(self.lm.logits(hidden[last]), engine_inputs)
        if kept:
            out.row_outputs[THINKER_EMBED] = embeds[last][:, None, :]
            accepted = self.lm.model.norm(kept[0]) if self.accept_layer == self.text.num_layers else kept[0]
            self._talker_prompt(out, engine_inputs, infos, input_ids, embeds, accepted)
        return out

    def _talker_prompt(
        self,
        out: BatchedModelOutput,
        engine_inputs: ModelInputsFromEngine,
        infos: list[CurrentForwardPassInfo],
        input_ids: torch.Tensor,
        embeds: torch.Tensor,
        accepted: torch.Tensor,
    ) -> None:
        """Speech prefill rows: write this chunk's Talker rows into the request's state (by
        cache position, so a recomputed chunk writes the same rows again); after the last
        chunk, output them all."""
        if not any(i.walk == SPEECH_PREFILL for i in infos):
            return
        assert engine_inputs.qo_indptr is not None
        bounds = engine_inputs.qo_indptr.tolist()
        media = torch.isin(input_ids, torch.tensor(self.media_ids, device=input_ids.device))
        rows = torch.where(media[:, None], accepted, embeds)
        for k, (rid, info) in enumerate(zip(engine_inputs.request_ids, infos, strict=True)):
            if info.walk != SPEECH_PREFILL:
                continue
            state = engine_inputs.per_request_states[rid]
            part = rows[bounds[k] : bounds[k + 1]]
            start, end = info.num_computed_tokens, info.num_computed_tokens + part.shape[0]
            buf = state.get(PROMPT_ROWS)
            if buf is None or buf.shape[0] < end:
                grown = part.new_zeros(max(end, 2 * (0 if buf is None else buf.shape[0])), part.shape[1])
                if buf is not None:
                    grown[: buf.shape[0]] = buf
                buf = grown
            buf[start:end] = part
            state.add(PROMPT_ROWS, buf)
            if info.is_last_chunk:
                out.per_rid_outputs.setdefault(rid, {})[TALKER_PROMPT] = buf[:end][None].clone()
                state.tensors.pop(PROMPT_ROWS, None)

    # ---- pieces ------------------------------------------------------------------------

    def _media_inputs(self, ids: torch.Tensor, signals: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Encoder outputs by prompt row; counts must equal the placeholders."""
        rows, embeds, ds_rows, ds = [], [], [], []
        for token, key, deep in (
            (self.mm.image_token_id, IMAGE_EMBEDS, IMAGE_DEEPSTACK),
            (self.mm.video_token_id, VIDEO_EMBEDS, VIDEO_DEEPSTACK),
            (self.mm.audio_token_id, AUDIO_EMBEDS, None),
        ):
            where = torch.nonzero(ids == token).reshape(-1)
            value = signals.get(key)
            if value is None:
                if where.numel():
                    kind = key.split("_")[0]
                    raise ValueError(
                        f"the prompt has {where.numel()} {kind} placeholders but no {kind} embeddings "
                        f"(pass the processor's {kind} tensors with request kwarg media=[..., {kind!r}])"
                    )
                continue
            value = torch.as_tensor(value)
            if value.shape != (where.numel(), self.text.hidden_size):
                raise ValueError(f"{key} has shape {list(value.shape)}; the prompt needs [{where.numel()}, {self.text.hidden_size}]")
            rows.append(where)
            embeds.append(value)
            if deep is not None and signals.get(deep) is not None:
                ds_rows.append(where)
                ds.append(torch.as_tensor(signals[deep]))
        out: dict[str, torch.Tensor] = {}
        if rows:
            out[MM_ROWS], out[MM_EMBEDS] = torch.cat(rows), torch.cat(embeds)
        if ds_rows:
            out[DS_ROWS], out[DS_EMBEDS] = torch.cat(ds_rows), torch.cat(ds, dim=1)
        return out

    def init_random(self, std: float) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)
