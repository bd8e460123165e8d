"""Node ``codec``: decodes chunks of the talker's code stream to audio (engine kind stateless).

Stateful (the default): each chunk holds only new frames; the decoder's carried state
(``mstar.layers.streaming.StreamState``) lives in the request's ``PerRequestState``, which
the engine frees when the request leaves, so every chunk costs the same. Otherwise each
chunk arrives with left-context frames already decoded before and their audio is dropped.
Either way, with the exact receptive field the chunks join to one whole decode.

A voice-cloned request (Base, in-context mode) also carries its reference codes
(``ref_codes``): as in qwen-tts, the generated frames are decoded after them and their audio
is dropped. Stateful: the first chunk runs behind the reference codes; later chunks carry
them in the state. Otherwise each chunk's left context is topped up with the last reference
frames, up to ``left_context`` frames.

Batching (stateful only): chunks of equal length from different requests share one decoder
call of a fixed size (padded with silent fresh streams): ``first_batch`` rows for streams at
their first chunk, ``batch`` rows for the others. The size depends only on the row's own
stream, never on how many real rows share the call, so a row's arithmetic is the same
whatever else runs: a seeded request's audio stays byte-identical under load. (A small
``first_batch`` keeps the first chunk, and so the time to first audio, as cheap as alone.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from mstar.layers.streaming import StreamState
from mstar.model.submodule_base import (
    BatchedModelOutput,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
)

from mstar_qwen3tts.codec_decoder import CodecDecoder
from mstar_qwen3tts.config import CodecConfig

STATE_KEY = "codec_stream"


class CodecNode(NodeSubmodule):
    # Decoding reads the weights and the rows' own stream states only.
    concurrent_forwards = True

    def __init__(
        self, cfg: CodecConfig, stateful: bool = True, batch: int = 1, left_context: int = 0, first_batch: int | None = None,
    ) -> None:
        """``batch``: rows of a call of continuing streams; ``first_batch`` (default
        ``batch``): rows of a call of streams at their first chunk."""
        super().__init__()
        first_batch = batch if first_batch is None else first_batch
        if batch < 1 or first_batch < 1:
            raise ValueError(f"codec batch sizes must be >= 1, got {batch} and first {first_batch}")
        self.cfg = cfg
        self.stateful = stateful
        self.left_context = left_context
        self.batch = batch if stateful else 1
        self.first_batch = first_batch if stateful else 1
        self.decoder = CodecDecoder(cfg)
        self._compiled_decoder: Any = None  # compile_regions' torch.compile of the decoder

    def compile_regions(self) -> int:
        """The streamed decode (``decode_chunks``' calls) through ``torch.compile`` with
        inductor's C++ wrapper: a call's ~900 small ops become a few dozen kernels that run
        without the GIL, so the talker's steps on the engine's other thread no longer wait
        for the codec's Python between them. CPU and stateful only (on CUDA, or re-decoding
        left context, it compiles nothing). Audio equals eager up to float rounding, and a
        row's arithmetic still depends only on its own call's fixed size. Compiled with
        dynamic shapes from the first call: a stream's chunks come in several lengths (the
        first chunk, whole ones, a shorter last one), and each would otherwise compile anew."""
        if not self.stateful or self.decoder.pre_conv.conv.weight.device.type != "cpu":
            return 0
        self._compiled_decoder = torch.compile(self.decoder, dynamic=True, options={"cpp_wrapper": True})
        return 1

    def max_batch_size(self, graph_walk: str) -> int | None:
        # One forward decodes at most one fixed-size call's rows: on a worker thread beside
        # the talker (overlap_nodes), each forward's audio goes out as soon as it is done
        # instead of after every ready chunk was decoded (the time to first audio under load).
        return max(self.batch, self.first_batch)

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Batch shape changes conv rounding: only fixed-size calls keep a seeded request's
        # audio byte-identical whatever else the server is doing (see decode_chunks).
        return max(self.batch, self.first_batch) > 1

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        codes = signals["code_chunk"].reshape(-1, self.cfg.num_quantizers).to(torch.long)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codec codes must lie in [0, {self.cfg.codebook_size})")
        context = int(signals["code_context"]) if "code_context" in signals else 0
        if self.stateful and context:
            raise ValueError("a stateful codec takes chunks without left context")
        ref = signals.get("ref_codes")
        if ref is None and info.request_kwargs.get("clone_encode") == "in_context":
            # Made by node codec_encoder, a signal of the talker's engine process only.
            raise ValueError("an in-context clone's ref_codes never reached the codec: place node codec next to codec_encoder")
        ref = codes.new_zeros(0, self.cfg.num_quantizers) if ref is None else ref.reshape(-1, self.cfg.num_quantizers).to(torch.long)
        if ref.numel() and (int(ref.min()) < 0 or int(ref.max()) >= self.cfg.codebook_size):
            raise ValueError(f"ref_codes must lie in [0, {self.cfg.codebook_size})")
        if not self.stateful:
            # Re-decoded context: the stream's own frames first, then reference frames before them.
            extra = min(ref.shape[0], max(0, self.left_context - context))
            if extra:
                codes, context = torch.cat([ref[ref.shape[0] - extra :], codes]), context + extra
            ref = ref[:0]
        return NodeInputs(tensor_inputs={"codes": codes, "ref": ref}, kwargs={"context": context}, input_seq_len=codes.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.decoder.pre_conv.conv.weight.device
        return {
            "codes": [i.tensor_inputs["codes"].to(device) for i in inputs],
            "contexts": [i.kwargs["context"] for i in inputs],
            "refs": [i.tensor_inputs["ref"].to(device) for i in inputs],
        }

    def decode(self, codes: torch.Tensor, context: int = 0) -> torch.Tensor:
        """Frames [T, G] → audio samples of frames ``context``..T-1 (float32, 1-D)."""
        wav = self.decoder(codes.T[None])
        return wav[0, 0, context * self.decoder.samples_per_frame :]

    def decode_chunk(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next frames [T, G] of the stream ``state`` carries → their audio (1-D);
        ``state`` advances."""
        return self.decoder(codes.T[None], state)[0, 0]

    def decode_chunks(self, codes: list[torch.Tensor], states: list[StreamState]) -> tuple[list[torch.Tensor], list[StreamState]]:
        """Chunks [T_i, G] of several streams → (their audio, their advanced states).

        Chunks of one length share calls of exactly ``self.first_batch`` rows (streams at
        their first chunk) or ``self.batch`` rows (the others); unused rows decode zeros from
        a fresh state and are dropped."""
        audio: list[torch.Tensor] = [torch.empty(0)] * len(codes)
        advanced = list(states)
        groups: dict[tuple[bool, int], list[int]] = {}
        for i, c in enumerate(codes):
            groups.setdefault((not states[i].entries, c.shape[0]), []).append(i)
        for (first, length), rows in groups.items():
            size = self.first_batch if first else self.batch
            for start in range(0, len(rows), size):
                run = rows[start : start + size]
                pad = size - len(run)
                filler = codes[run[0]].new_zeros(length, self.cfg.num_quantizers)
                batch_codes = torch.stack([c.T for c in [*(codes[i] for i in run), *[filler] * pad]])
                state = StreamState.stack([*(states[i] for i in run), *(StreamState() for _ in range(pad))])
                decoder = self.decoder if self._compiled_decoder is None else self._compiled_decoder
                wav = decoder(batch_codes, state)[:, 0]
                for i, row_wav, row_state in zip(run, wav, state.split([1] * size), strict=False):
                    audio[i], advanced[i] = row_wav, row_state
        return audio, advanced

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, codes: list[torch.Tensor], contexts: list[int],
        refs: list[torch.Tensor] | None = None,
    ) -> BatchedModelOutput:
        rids = engine_inputs.request_ids
        if not self.stateful:
            return BatchedModelOutput(
                per_rid_outputs={rid: {"audio": self.decode(c, ctx)} for rid, c, ctx in zip(rids, codes, contexts, strict=True)}
            )
        stores = [engine_inputs.per_request_states[rid] for rid in rids]
        olds = [store.get(STATE_KEY) for store in stores]
        # A fresh stream of a cloned voice decodes its reference frames first (audio dropped).
        skips = [ref.shape[0] if old is None and refs is not None else 0 for old, ref in zip(olds, refs or [None] * len(rids), strict=True)]
        chunks = [torch.cat([refs[i], c]) if skips[i] else c for i, c in enumerate(codes)]  # type: ignore[index]
        audio, states = self.decode_chunks(chunks, [old or StreamState() for old in olds])
        for store, state in zip(stores, states, strict=True):
            store.add(STATE_KEY, state)
        spf = self.decoder.samples_per_frame
        return BatchedModelOutput(per_rid_outputs={rid: {"audio": a[n * spf :]} for rid, a, n in zip(rids, audio, skips, strict=True)})
