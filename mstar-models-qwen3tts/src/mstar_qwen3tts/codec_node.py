"""Node ``codec``: decodes chunks of the talker's code stream to audio (engine kind stateless).

Stateful (the default): each chunk holds only new frames; the decoder's carried state
(``mstar.layers.streaming.StreamState``) lives in the request's ``PerRequestState``, which
the engine frees when the request leaves, so every chunk costs the same. Otherwise each
chunk arrives with left-context frames already decoded before and their audio is dropped.
Either way, with the exact receptive field the chunks join to one whole decode.
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
    def __init__(self, cfg: CodecConfig, stateful: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.stateful = stateful
        self.decoder = CodecDecoder(cfg)

    def get_autocast_dtype(self) -> torch.dtype:
        return torch.float32

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        # Batch shape changes conv/matmul rounding; one chunk at a time keeps a seeded
        # request's audio byte-identical whatever else the server is doing.
        return False

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        codes = signals["code_chunk"].reshape(-1, self.cfg.num_quantizers).to(torch.long)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codec codes must lie in [0, {self.cfg.codebook_size})")
        context = int(signals["code_context"]) if "code_context" in signals else 0
        if self.stateful and context:
            raise ValueError("a stateful codec takes chunks without left context")
        return NodeInputs(tensor_inputs={"codes": codes}, kwargs={"context": context}, input_seq_len=codes.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.decoder.pre_conv.conv.weight.device
        return {
            "codes": [i.tensor_inputs["codes"].to(device) for i in inputs],
            "contexts": [i.kwargs["context"] for i in inputs],
        }

    def decode(self, codes: torch.Tensor, context: int = 0) -> torch.Tensor:
        """Frames [T, G] → audio samples of frames ``context``..T-1 (float32, 1-D)."""
        wav = self.decoder(codes.T[None])
        return wav[0, 0, context * self.decoder.samples_per_frame :]

    def decode_chunk(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next frames [T, G] of the stream ``state`` carries → their audio (1-D);
        ``state`` advances."""
        return self.decoder(codes.T[None], state)[0, 0]

    def forward_batched(
        self, graph_walk: str, engine_inputs: ModelInputsFromEngine, codes: list[torch.Tensor], contexts: list[int]
    ) -> BatchedModelOutput:
        rids = engine_inputs.request_ids
        if not self.stateful:
            return BatchedModelOutput(
                per_rid_outputs={rid: {"audio": self.decode(c, ctx)} for rid, c, ctx in zip(rids, codes, contexts, strict=True)}
            )
        per_rid = {}
        for rid, c in zip(rids, codes, strict=True):
            store = engine_inputs.per_request_states[rid]
            state = store.get(STATE_KEY) or StreamState()
            per_rid[rid] = {"audio": self.decode_chunk(c, state)}
            store.add(STATE_KEY, state)
        return BatchedModelOutput(per_rid_outputs=per_rid)
