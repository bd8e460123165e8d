"""The talker: a Qwen3-style LM over summed text + codec embeddings on the paged KV cache.

Each step it samples a frame's first codebook with the main sampler (non-codec ids
suppressed as qwen-tts does), runs the code predictor for the residual groups (auxiliary
label), and prepares the next step's input embedding: the frame's summed code embeddings
plus the next text embedding (or the text pad). Node ``talker``; walks ``prefill`` and
``decode``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from mstar.attention.compiled_layers import compile_with_attention
from mstar.layers import RMSNorm, RotaryEmbedding, signed_sin
from mstar.model.digest import tensor_digest
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
from mstar.sampling.compiled_region import compile_region
from torch import nn

from mstar_qwen3tts.code_predictor import CodePredictor
from mstar_qwen3tts.config import Qwen3TTSConfig, TalkerConfig
from mstar_qwen3tts.transformer import DecoderLayer

PIECEWISE_LABEL = "code_predictor"
# codec_ids markers (mstar_qwen3tts.prompt): text only; the cloned speaker's x-vector; the
# next reference frame.
NO_CODEC, SPEAKER_SLOT, REF_FRAME = -1, -2, -3


@dataclass
class TalkerInputs(ARNodeInputs):
    """A prefill's inputs, with what each embedding row was summed from (``text_ids``,
    ``codec_ids``, ``speaker_embed``, ``ref_codes``): prefix caching's identities, worked
    out only when asked for (``Talker.prefix_cache_keys``)."""

    prompt_sources: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None = None


def prompt_identities(
    text_ids: torch.Tensor, codec_ids: torch.Tensor, speaker_embed: torch.Tensor | None, ref_codes: torch.Tensor | None
) -> list[Hashable]:
    """One identity per prefill position naming everything ``Talker.prompt_embeds`` sums
    there: (text id, codec id); a speaker slot adds a digest of the x-vector's exact bytes,
    a reference frame its codes (the frame's own: frames are taken in order). The sources
    rather than a digest of each row's bytes: the text projection's rows can differ in their
    last bits with the prompt's length (its matmul picks kernels by row count; seen here on
    CPU for 1-3 rows), which would cost hits, not correctness, and hashing them costs more."""
    text, codec = text_ids.reshape(-1).tolist(), codec_ids.reshape(-1).tolist()
    speaker = tensor_digest(speaker_embed) if speaker_embed is not None and SPEAKER_SLOT in codec else None
    frames = iter(ref_codes.to(torch.long).tolist()) if ref_codes is not None and REF_FRAME in codec else iter(())
    out: list[Hashable] = []
    for t, c in zip(text, codec, strict=True):
        if c == SPEAKER_SLOT:
            out.append((t, c, speaker))
        elif c == REF_FRAME:
            out.append((t, c, *next(frames)))
        else:
            out.append((t, c))
    return out


class TalkerModel(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TextProjection(nn.Module):
    """Text embeddings (text width) → talker width."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(torch.nn.functional.silu(self.linear_fc1(x)))


class Talker(ARNodeSubmodule):
    def __init__(self, config: Qwen3TTSConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        cfg = config.talker
        assert cfg.predictor is not None
        self.cfg = cfg
        self.dtype = dtype
        self.tts_pad_id = config.tts_pad_token_id
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.predictor, cfg.hidden_size)
        # Multimodal RoPE reduces to plain RoPE for speech: a position is the same on its three axes.
        self.rope = RotaryEmbedding(cfg.head_dim, {"rope_theta": cfg.rope_theta})
        suppress = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        suppress[cfg.vocab_size - len(cfg.suppressed_ids):] = True
        suppress[cfg.codec_eos_token_id] = False
        self.register_buffer("suppress_mask", suppress, persistent=False)
        self._compiled_frame: Any = None  # compile_regions' compiled sample_frame
        self._compiled_stack: Any = None  # and its compiled layer stack

    # ---- engine contract ---------------------------------------------------------------
    def compile_regions(self) -> int:
        """Two regions compiled whole with inductor's C++ wrapper (their ~1,200 small ops a
        step of a mid-size checkpoint become fused kernels that run without the GIL, so the
        codec's worker thread runs beside them): the frame region (first code, the code
        predictor's depth loop, the summed code embeddings), its draws through the batch's
        own sampler (``mstar.sampling.compiled_region``), and the layer stack with its
        head, its paged attention through the step's backend
        (``mstar.attention.compiled_layers``). CPU only: on CUDA the frame is the region for
        CUDA graph capture, and a compiled region inside a capture has never run."""
        if self.codec_head.weight.device.type != "cpu":
            return 0
        self._compiled_frame = compile_region(self._sample_frame, cpp_wrapper=True)
        self._compiled_stack = compile_with_attention(self._layer_stack, cpp_wrapper=True)
        return 2

    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.cfg.num_hidden_layers, self.cfg.num_key_value_heads, self.cfg.head_dim, self.dtype)

    def max_model_len(self) -> int:
        return self.cfg.max_position_embeddings

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        trailing = signals["trailing_ids"].reshape(-1)
        sources = None
        if info.walk == "prefill":
            sources = (signals["text_ids"], signals["codec_ids"], signals.get("speaker_embed"), signals.get("ref_codes"))
            embeds = self.prompt_embeds(sources[0], sources[1], trailing, sources[2], sources[3])
        else:
            embeds = signals["next_embed"].reshape(1, -1)
        # The text fed with the *next* step: the trailing text one token per frame, then pad.
        k = info.num_generated
        next_text = int(trailing[k]) if k < trailing.numel() else self.tts_pad_id
        return TalkerInputs(input_embeds=embeds, input_seq_len=embeds.shape[0], kwargs={"next_text_id": next_text},
                            prompt_sources=sources)

    def prefix_cache_keys(
        self, graph_walk: str, info: CurrentForwardPassInfo, inputs: ARNodeInputs
    ) -> Sequence[Hashable] | None:
        """A prefill position is identified by what its embedding row sums
        (``prompt_identities``), so requests whose prompts open alike (a voice's head: role,
        think tags, speaker, and a cloned voice's transcript; an instruction) share those
        blocks. Positions are the plain cache positions and ``next_text_id`` only shapes
        the last position's outputs, so neither needs naming; nothing reads the other
        positions' outputs, so any of them may be skipped. Decode rows (sampled frames,
        on the device) have no identity: nothing after the prompt is shared."""
        if not isinstance(inputs, TalkerInputs) or inputs.prompt_sources is None:
            return None
        return prompt_identities(*inputs.prompt_sources)

    def prompt_embeds(
        self, text_ids: torch.Tensor, codec_ids: torch.Tensor, trailing_ids: torch.Tensor,
        speaker_embed: torch.Tensor | None = None, ref_codes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prefill embeddings: projected text plus the codec part, position by position (a
        codec id, nothing, the speaker's x-vector, or a reference frame's summed codes)."""
        text_ids, codec_ids = text_ids.reshape(-1).to(torch.long), codec_ids.reshape(-1).to(torch.long)
        if text_ids.numel() == 0 or text_ids.shape != codec_ids.shape:
            raise ValueError(
                f"text_ids and codec_ids must be non-empty and of one length, got {tuple(text_ids.shape)} "
                f"and {tuple(codec_ids.shape)}"
            )
        _check_range("text_ids and trailing_ids", torch.cat([text_ids, trailing_ids.to(torch.long)]), 0, self.cfg.text_vocab_size)
        _check_range("codec_ids", codec_ids, REF_FRAME, self.cfg.vocab_size)
        device = self.codec_head.weight.device
        with torch.inference_mode():
            text_ids, codec_ids = text_ids.to(device), codec_ids.to(device)
            codec = self.model.codec_embedding(codec_ids.clamp(min=0))
            codec = codec * (codec_ids >= 0).unsqueeze(-1).to(codec.dtype)
            slots = (codec_ids == SPEAKER_SLOT).nonzero().flatten()
            if slots.numel():
                if speaker_embed is None or speaker_embed.numel() != self.cfg.hidden_size:
                    raise ValueError(f"a speaker slot needs speaker_embed of {self.cfg.hidden_size} values")
                codec[slots] = speaker_embed.reshape(1, -1).to(device=device, dtype=codec.dtype)
            frames = (codec_ids == REF_FRAME).nonzero().flatten()
            if frames.numel():
                codec[frames] = self.frame_embeds(self._checked_ref_codes(ref_codes, frames.numel()).to(device)).to(codec.dtype)
            return self.text_embeds(text_ids) + codec

    def frame_embeds(self, codes: torch.Tensor) -> torch.Tensor:
        """Frames [T, G] → their summed code embeddings [T, hidden] (the first group by the
        talker's table, the residual groups by the code predictor's)."""
        out = self.model.codec_embedding(codes[:, 0])
        for g, table in enumerate(self.code_predictor.model.codec_embedding, start=1):
            out = out + table(codes[:, g])
        return out

    def _checked_ref_codes(self, ref_codes: torch.Tensor | None, frames: int) -> torch.Tensor:
        groups = self.cfg.num_code_groups
        if ref_codes is None or ref_codes.dim() != 2 or tuple(ref_codes.shape) != (frames, groups):
            got = None if ref_codes is None else tuple(ref_codes.shape)
            raise ValueError(f"{frames} reference-frame positions need ref_codes of shape ({frames}, {groups}), got {got}")
        ref_codes = ref_codes.to(torch.long)
        _check_range("ref_codes", ref_codes, 0, self.cfg.predictor.vocab_size)  # type: ignore[union-attr]
        return ref_codes

    def text_embeds(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list) -> dict[str, Any]:
        device = self.codec_head.weight.device
        # A cache replay (after preemption) concatenates inputs without kwargs; its
        # outputs are discarded, so any text id does.
        next_ids = [i.kwargs.get("next_text_id", self.tts_pad_id) for i in inputs]
        return {
            "input_embeds": torch.cat([i.input_embeds for i in inputs]).to(device=device, dtype=self.dtype),
            "next_text_ids": torch.tensor(next_ids, dtype=torch.long).to(device),
        }

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, input_embeds: torch.Tensor, next_text_ids: torch.Tensor
    ) -> BatchedModelOutput:
        assert engine_inputs.positions is not None
        stack = self._layer_stack if self._compiled_stack is None else self._compiled_stack
        hidden, logits = stack(engine_inputs.attention, input_embeds, engine_inputs.positions, engine_inputs.last_token_index.long())
        region = {"hidden": hidden, "logits": logits}
        out = engine_inputs.run_region(PIECEWISE_LABEL, self.sample_frame, region)
        next_embed = out["frame_embed"] + self.text_embeds(next_text_ids)
        return BatchedModelOutput(row_outputs={"codes": out["codes"][:, None, :], "next_embed": next_embed[:, None, :]})

    def _layer_stack(
        self, attention: Any, x: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat tokens [T, H] at ``positions`` through the layers → (the rows' normed last
        hidden states [B, H], their codec logits with the non-codec ids suppressed)."""
        cos, sin = self.rope(positions, x.dtype)
        sin = signed_sin(sin)
        for i, layer in enumerate(self.model.layers):
            x = layer.forward_paged(x, cos, sin, attention, i)
        hidden = self.model.norm(x[last])
        return hidden, self.codec_head(hidden).masked_fill(self.suppress_mask, float("-inf"))

    def sample_frame(self, static_inputs: dict[str, torch.Tensor], sampler: Any) -> dict[str, torch.Tensor]:
        """The captured region: first codebook (main sampler), the code predictor's depth
        loop (aux sampler), and the frame's summed code embeddings."""
        if self._compiled_frame is not None:
            return self._compiled_frame(static_inputs, sampler)
        return self._sample_frame(static_inputs, sampler)

    def _sample_frame(self, static_inputs: dict[str, torch.Tensor], sampler: Any) -> dict[str, torch.Tensor]:
        first = sampler.sample(static_inputs["logits"]).tokens
        first_embed = self.model.codec_embedding(first)
        residual, residual_embed = self.code_predictor(static_inputs["hidden"], first_embed, sampler)
        codes = torch.cat([first[:, None], residual], dim=1)
        return {"codes": codes, "frame_embed": first_embed + residual_embed}

    def check_stop_batched(
        self, request_ids: list[str], infos: list[CurrentForwardPassInfo], outputs: BatchedModelOutput
    ) -> BatchedStopCheck:
        # Core applies max_tokens and the stop ids; an EOS frame kept by ignore_eos has no audio.
        firsts = outputs.row_outputs["codes"][:, 0, 0].tolist()
        eos = self.cfg.codec_eos_token_id
        return BatchedStopCheck({rid: StopCheck(withheld=("codes",)) for rid, tok in zip(request_ids, firsts, strict=True) if tok == eos})


def _check_range(name: str, ids: torch.Tensor, low: int, high: int) -> None:
    if ids.numel() and (int(ids.min()) < low or int(ids.max()) >= high):
        raise ValueError(f"{name} must lie in [{low}, {high}), got values in [{int(ids.min())}, {int(ids.max())}]")
