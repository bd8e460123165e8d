"""Nodes ``speaker_encoder`` and ``codec_encoder`` (Base checkpoints, engine kind stateless):
the clone prompt of a request's reference clip, computed in the engine.

The preprocess pool does the cheap CPU work (``mstar_qwen3tts.clone_prompt.clip_inputs``):
request inputs ``ref_mel`` [frames, mel_dim] (the clip's log-mel features at the speaker
encoder's rate) and, for in-context cloning, ``ref_wave`` [samples] (the clip at the speech
tokenizer's rate). Walk ``encode_speaker`` turns ``ref_mel`` into ``speaker_embed`` [D];
walk ``encode_reference`` turns ``ref_wave`` into ``ref_codes`` [T, G]. Both persist: the
talker's prefill reads them, the codec decodes after ``ref_codes``.

Batching: the rows of one forward are grouped by length, and each group runs in calls of
exactly ``batch`` rows (padded with zero rows), so a row's arithmetic never depends on what
else runs and a seeded clone stays byte-identical alone and under load. Clips are never
padded to a common length: the speaker encoder pads by reflection and pools over time, and
the codec encoder's last (partial) frame sees its convolutions' zero padding, so padding a
clip would change its outputs.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import torch
from mstar.model.digest import tensor_digest
from mstar.model.submodule_base import (
    BatchedModelOutput,
    CurrentForwardPassInfo,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
)

from mstar_qwen3tts.codec_encoder import CodecEncoder
from mstar_qwen3tts.speaker_encoder import SpeakerEncoder

REF_MEL, REF_WAVE = "ref_mel", "ref_wave"  # request inputs (from the pool)


def run_by_length(rows: list[torch.Tensor], fn: Callable[[torch.Tensor], torch.Tensor], batch: int) -> list[torch.Tensor]:
    """``fn`` over ``rows`` (tensors whose dim 0 is a length): rows of one length are stacked
    into calls of exactly ``batch`` rows, the unused ones zeros (their outputs dropped)."""
    out: list[torch.Tensor | None] = [None] * len(rows)
    by_length: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(tuple(row.shape), []).append(i)
    for idx in by_length.values():
        for start in range(0, len(idx), batch):
            run = idx[start : start + batch]
            stacked = torch.stack([rows[i] for i in run] + [torch.zeros_like(rows[run[0]])] * (batch - len(run)))
            for i, value in zip(run, fn(stacked), strict=False):
                out[i] = value
    return out  # type: ignore[return-value]


class _EncoderNode(NodeSubmodule):
    """One input signal per row → one output signal per row, batched by ``run_by_length``."""

    input_name: str
    output_name: str

    def __init__(self, batch: int) -> None:
        super().__init__()
        if batch < 1:
            raise ValueError(f"encoder batch must be >= 1, got {batch}")
        self.batch = batch
        self.calls = 0  # encoder calls so far (each of ``batch`` rows), for tests and benchmarks

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        return True  # forward_batched groups the rows itself

    @abstractmethod
    def check_row(self, value: torch.Tensor) -> torch.Tensor:
        """One row's input, checked (ValueError naming the input if bad)."""

    @abstractmethod
    def encode(self, stacked: torch.Tensor) -> torch.Tensor:
        """[batch, length, ...] → one output per row."""

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        value = signals.get(self.input_name)
        if value is None:
            raise ValueError(f"walk {graph_walk!r} needs request input {self.input_name!r}")
        return NodeInputs(tensor_inputs={"x": self.check_row(torch.as_tensor(value))})

    def output_cache_key(self, graph_walk: str, info: CurrentForwardPassInfo, inputs: NodeInputs) -> Hashable:
        """The same clip's features encode to the same bytes (a row's arithmetic never
        depends on what else runs): with prefix caching a clip sent again is not encoded again."""
        return graph_walk, tensor_digest(inputs.tensor_inputs["x"])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        device = next(self.parameters()).device
        return {"rows": [i.tensor_inputs["x"].to(device=device, dtype=torch.float32) for i in inputs]}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, rows: list[torch.Tensor]) -> BatchedModelOutput:
        def call(stacked: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.encode(stacked)

        outs = run_by_length(rows, call, self.batch)
        return BatchedModelOutput(per_rid_outputs={
            rid: {self.output_name: out} for rid, out in zip(engine_inputs.request_ids, outs, strict=True)
        })


class SpeakerEncoderNode(_EncoderNode):
    """``ref_mel`` [frames, mel_dim] → ``speaker_embed`` [D] (float32)."""

    input_name, output_name = REF_MEL, "speaker_embed"

    def __init__(self, encoder: SpeakerEncoder, batch: int = 1) -> None:
        super().__init__(batch)
        self.encoder = encoder

    def check_row(self, value: torch.Tensor) -> torch.Tensor:
        mel_dim = self.encoder.cfg.mel_dim
        if value.dim() != 2 or value.shape[1] != mel_dim or value.shape[0] == 0 or not value.is_floating_point():
            raise ValueError(f"{REF_MEL} must be float [frames, {mel_dim}] with frames > 0, got {value.dtype} {tuple(value.shape)}")
        return value

    def encode(self, stacked: torch.Tensor) -> torch.Tensor:
        return self.encoder(stacked).float()


class CodecEncoderNode(_EncoderNode):
    """``ref_wave`` [samples] → ``ref_codes`` [frames, G] (int64)."""

    input_name, output_name = REF_WAVE, "ref_codes"

    def __init__(self, encoder: CodecEncoder, batch: int = 1) -> None:
        super().__init__(batch)
        self.encoder = encoder

    def check_row(self, value: torch.Tensor) -> torch.Tensor:
        if value.dim() != 1 or value.numel() == 0 or not value.is_floating_point():
            raise ValueError(f"{REF_WAVE} must be float [samples] with samples > 0, got {value.dtype} {tuple(value.shape)}")
        return value

    def encode(self, stacked: torch.Tensor) -> torch.Tensor:
        return self.encoder.encode_batch(stacked)


def encoder_batch(config: dict[str, Any], device: str) -> int:
    from mstar_qwen3tts.config import Qwen3TTSConfig

    batch = Qwen3TTSConfig.from_dict(config).streaming.encoder_batch
    # A padded batch is nearly free on a GPU; on a CPU every filler row costs its compute.
    return batch if batch is not None else (8 if torch.device(device).type == "cuda" else 1)


def build_speaker_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> SpeakerEncoderNode:
    from mstar.weights import load_weights

    from mstar_qwen3tts.checkpoint_keys import SPEAKER_ENCODER_KEYS
    from mstar_qwen3tts.config import Qwen3TTSConfig

    encoder = SpeakerEncoder(Qwen3TTSConfig.from_dict(config).speaker_encoder)
    if checkpoint_dir is not None:
        load_weights(encoder, checkpoint_dir, **SPEAKER_ENCODER_KEYS)
    return SpeakerEncoderNode(encoder.eval(), encoder_batch(config, device)).to(device=device, dtype=dtype)


def build_codec_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> CodecEncoderNode:
    from mstar.weights import load_weights

    from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_ENCODER_KEYS
    from mstar_qwen3tts.clone_loading import codec_encoder_from_config

    encoder = codec_encoder_from_config(config)
    if checkpoint_dir is not None:
        load_weights(encoder, Path(checkpoint_dir) / CODEC_DIR, **CODEC_ENCODER_KEYS)
    return CodecEncoderNode(encoder.eval(), encoder_batch(config, device)).to(device=device, dtype=dtype)
