"""Code2Wav: a frame's codes of every codebook group -> 24 kHz waveform, as transformers'
``Qwen3OmniMoeCode2Wav`` computes it (mean of per-group code embeddings, sliding-window
pre-transformer, transposed-conv + ConvNeXt upsampling, Snake decoder blocks, clamp to [-1, 1]).

Two ways to run it:

- ``forward(codes)``: stateless and batched, codes [B, Q, T] -> audio [B, 1, N(T)] with
  ``N(T) = samples_per_frame * T - tail`` (the decoder blocks' two-sided trims drop a fixed
  tail; ``whole_length``).
- ``stream(codes, state)``: the next frames of B streams, each with a ``StreamState``
  (``mstar.layers.streaming``) that carries convolution histories, transposed-conv overlap
  tails and the attention window. Chunks join to exactly the whole decode (float rounding
  aside) and each costs the same however far into the stream it is. ``stream_chunks`` decodes
  chunks of many streams, grouping those that can share one call.

transformers' own ``chunked_decode`` (chunks of 300 frames, 25 frames of left context) is not
the whole decode: every chunk loses the trimmed tail and the 25-frame context is shorter than
the pre-transformer's receptive field. ``stream`` equals ``forward`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from mstar.layers.codec_blocks import ConvNeXtBlock, SnakeBeta
from mstar.layers.streaming import CausalConv1d, CausalConvTranspose1d, StreamState
from torch import nn

from mstar_qwen3omni.code2wav_config import Code2WavConfig
from mstar_qwen3omni.code2wav_layers import DecoderBlock
from mstar_qwen3omni.code2wav_transformer import PreTransformer


class Code2Wav(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, h)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(h, h, f, f), ConvNeXtBlock(h)]) for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv1d(h, cfg.decoder_dim, 7),
                *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)),
                SnakeBeta(dims[-1]),
                CausalConv1d(dims[-1], 1, 7),
            ]
        )
        with torch.device("cpu"):  # a plain attribute: never meta, never cast
            self._offsets = torch.arange(cfg.num_quantizers)[None, :, None] * cfg.codebook_size

    def whole_length(self, frames: int) -> int:
        """Samples ``forward`` returns for ``frames`` frames (each decoder block trims its stride once)."""
        n = frames * math.prod(self.cfg.upsampling_ratios)
        for rate in self.cfg.upsample_rates:
            n = (n - 1) * rate
        return n

    def _check(self, codes: torch.Tensor) -> None:
        if codes.ndim != 3 or codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"codes must be [batch, {self.cfg.num_quantizers}, frames], got {list(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.cfg.codebook_size})")

    def _decode(self, codes: torch.Tensor, state: StreamState | None) -> torch.Tensor:
        self._check(codes)
        offsets = self._offsets.to(codes.device)
        x = self.code_embedding(codes.long() + offsets).mean(1)  # [B, T, C]
        x = self.pre_transformer(x, state).transpose(1, 2)  # [B, C, T]
        for conv, block in self.upsample:  # type: ignore[misc]
            x = block(conv(x, state), state)
        for layer in self.decoder:
            x = layer(x, state)
        return x.clamp(-1.0, 1.0)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] (ints in [0, codebook_size)) -> audio [B, 1, whole_length(T)]."""
        return self._decode(codes, None)

    def stream(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next T frames of ``state.batch`` streams, all first chunks or all later ones
        -> their audio [B, 1, n]; a first chunk yields ``whole_length(T)`` samples, a later
        one ``samples_per_frame * T``."""
        if state.batch != codes.shape[0]:
            raise ValueError(f"a stream state of batch {state.batch} cannot decode {codes.shape[0]} rows")
        return self._decode(codes, state)

    def stream_chunks(
        self, chunks: Sequence[torch.Tensor], states: Sequence[StreamState | None], batch: int | None = None
    ) -> tuple[list[torch.Tensor], list[StreamState]]:
        """Chunks [Q, T_i] of several streams (``None`` = a new stream) -> (audio [n_i] per
        chunk, each stream's advanced state). Chunks of one length and phase (first or later)
        share calls; with ``batch`` every call has exactly that many rows (spare rows decode a
        copy of a real row and are dropped), so a row's arithmetic, and its audio bytes, do
        not depend on what else is decoded with it."""
        states = [s if s is not None else StreamState() for s in states]
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, (chunk, s) in enumerate(zip(chunks, states, strict=True)):
            groups.setdefault((chunk.shape[-1], not s.entries), []).append(i)
        audio: list[torch.Tensor | None] = [None] * len(chunks)
        out_states: list[StreamState | None] = [None] * len(chunks)
        for group in groups.values():
            size = batch or len(group)
            for at in range(0, len(group), size):
                rows = group[at : at + size]
                spare = [rows[0]] * (size - len(rows))  # same phase as the real rows
                state = StreamState.stack([states[i] for i in rows + spare])
                wav = self.stream(torch.stack([chunks[i] for i in rows + spare]), state)
                for i, w, s in zip(rows, wav[:, 0], state.split([1] * size), strict=False):
                    audio[i], out_states[i] = w, s
        return audio, out_states  # type: ignore[return-value]
