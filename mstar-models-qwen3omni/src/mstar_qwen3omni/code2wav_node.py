"""Node ``code2wav`` (engine kind stateless): decodes chunks of the Talker's frames to 24 kHz
audio as they arrive. Each chunk holds only new frames; Code2Wav's carried state
(``mstar.layers.streaming.StreamState``) lives in the request's ``PerRequestState`` under
``STATE_KEY``, which the engine frees when the request leaves, so every chunk costs the same
and the chunks join to one whole decode. Chunks of one length share decoder calls of exactly
``batch`` rows, so a seeded request's audio is byte-identical whatever else runs.

Signal: ``code_chunk`` [T, Q] (frames x codebook groups, the Talker's ``codes`` rows).
Output per request: ``audio`` [n] float32 (a first chunk of T frames yields
``Code2Wav.whole_length(T)`` samples, later ones ``samples_per_frame * T``).
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

from mstar_qwen3omni.code2wav import Code2Wav
from mstar_qwen3omni.code2wav_config import Code2WavConfig

STATE_KEY = "code2wav_stream"
CODE_CHUNK, AUDIO = "code_chunk", "audio"


class Code2WavNode(NodeSubmodule):
    def __init__(self, config: dict[str, Any], batch: int = 1) -> None:
        super().__init__()
        if batch < 1:
            raise ValueError(f"code2wav batch must be >= 1, got {batch}")
        self.cfg = Code2WavConfig.from_config(config)
        self.batch = batch
        self.code2wav = Code2Wav(self.cfg)

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        return self.batch > 1

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        q, size = self.cfg.num_quantizers, self.cfg.codebook_size
        codes = torch.as_tensor(signals[CODE_CHUNK]).reshape(-1, q).to(torch.long)
        if not codes.numel():
            raise ValueError("code2wav got an empty chunk")
        if int(codes.min()) < 0 or int(codes.max()) >= size:
            raise ValueError(f"code2wav codes must lie in [0, {size})")
        return NodeInputs(tensor_inputs={"codes": codes}, input_seq_len=codes.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = self.code2wav.code_embedding.weight.device
        return {"chunks": [i.tensor_inputs["codes"].T.to(device) for i in inputs]}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, chunks: list[torch.Tensor]) -> BatchedModelOutput:
        rids = engine_inputs.request_ids
        stores = [engine_inputs.per_request_states[rid] for rid in rids]
        states: list[StreamState | None] = [store.get(STATE_KEY) for store in stores]
        audio, advanced = self.code2wav.stream_chunks(chunks, states, self.batch)
        for store, state in zip(stores, advanced, strict=True):
            store.add(STATE_KEY, state)
        return BatchedModelOutput(per_rid_outputs={rid: {AUDIO: a} for rid, a in zip(rids, audio, strict=True)})
