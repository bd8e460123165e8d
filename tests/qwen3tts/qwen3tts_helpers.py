"""Helpers shared by the qwen3tts tests."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch
from mstar import Engine
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import assistant_text, build_prompt
from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

AUX = "code_predictor"


def sampling(main: dict[str, Any] | None = None, aux: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"talker": {"main": dict(main or {}), "aux": {AUX: dict(aux or {})}}}


def greedy(max_tokens: int, **main: Any) -> dict[str, Any]:
    return sampling({"temperature": 0.0, "max_tokens": max_tokens, **main}, {"temperature": 0.0})


@cache
def _tokenizer(ckpt: str) -> Any:
    return load_tokenizer(Path(ckpt))


@cache
def _config(ckpt: str) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(load_config(Path(ckpt)))


def token_ids(ckpt: Path, text: str) -> list[int]:
    return encode(_tokenizer(str(ckpt)), assistant_text(text))


def speech_inputs(
    ckpt: Path, text: str, speaker: str = "vivian", language: str = "auto", non_streaming_mode: bool = True
) -> dict[str, torch.Tensor]:
    cfg = _config(str(ckpt))
    return build_prompt(cfg, token_ids(ckpt, text), speaker, language, non_streaming_mode).inputs()


@cache
def _encoders(ckpt: str) -> tuple[Any, Any]:
    from mstar_qwen3tts.encoder_nodes import build_codec_encoder, build_speaker_encoder

    config = load_config(Path(ckpt))
    return build_speaker_encoder(config, Path(ckpt), "cpu"), build_codec_encoder(config, Path(ckpt), "cpu")


def encoded_inputs(ckpt: Path, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Base request's inputs with its clip's features (``ref_mel``, ``ref_wave``) replaced
    by what the engine's encoder nodes make of them (``speaker_embed``, ``ref_codes``)."""
    speaker, codec = _encoders(str(ckpt))
    out = {k: v for k, v in inputs.items() if k not in ("ref_mel", "ref_wave")}
    out["speaker_embed"] = speaker.encode(inputs["ref_mel"][None])[0]
    if "ref_wave" in inputs:
        out["ref_codes"] = codec.encode(inputs["ref_wave"][None])[0]
    return out


def frames(result: Any, groups: int) -> torch.Tensor:
    """A collected result's codes as [frames, groups]."""
    return result.cat("codes").reshape(-1, groups)


class LogitRecorder:
    """Forward hooks on an engine's talker head and code-predictor heads (run one request
    at a time while recording)."""

    def __init__(self, engine: Engine) -> None:
        talker = engine.core.nodes["talker"].submodule
        self.talker: list[torch.Tensor] = []
        self.predictor: list[torch.Tensor] = []
        self.groups = len(talker.code_predictor.lm_head)
        self._handles = [talker.codec_head.register_forward_hook(lambda m, a, o: self.talker.append(o.clone()))]
        self._handles += [
            head.register_forward_hook(lambda m, a, o: self.predictor.append(o.clone()))
            for head in talker.code_predictor.lm_head
        ]

    def talker_logits(self) -> torch.Tensor:
        """[steps, V] (batch of one)."""
        return torch.cat(self.talker)

    def predictor_logits(self) -> torch.Tensor:
        """[frames, groups - 1, codebook] (batch of one)."""
        return torch.cat(self.predictor).reshape(-1, self.groups, self.predictor[0].shape[-1])

    def __enter__(self) -> LogitRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()


def small_predictor(talker_hidden: int) -> Any:
    """A small random ``CodePredictor`` (2 layers, width 64, 6 code groups), seeded; its
    norm weights spread over [0.5, 1.5] so they are not all ones."""
    from mstar_qwen3tts.code_predictor import CodePredictor
    from mstar_qwen3tts.config import PredictorConfig

    cfg = PredictorConfig.from_dict({
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 48, "num_code_groups": 6,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "attention_bias": False,
    }, "test predictor")
    torch.manual_seed(0)
    model = CodePredictor(cfg, talker_hidden=talker_hidden)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()
