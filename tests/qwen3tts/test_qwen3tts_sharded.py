"""Qwen3-TTS checkpoints whose ``model.safetensors`` and ``speech_tokenizer/model.safetensors``
are both HF shards load through core's loader as the single files do: the engine serves the
same audio, and a Base checkpoint's clone encoders give the same outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.testing.sharding import shard_checkpoint
from mstar_qwen3tts.checkpoint_keys import CODEC_DIR
from mstar_qwen3tts.config import load_config
from mstar_qwen3tts.encoder_nodes import build_codec_encoder, build_speaker_encoder
from mstar_qwen3tts.tiny_checkpoint import write_base_checkpoint
from qwen3tts_helpers import greedy, speech_inputs


def sharded_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    shard_checkpoint(dst, 3)
    shard_checkpoint(dst, 2, f"{CODEC_DIR}/model.safetensors")
    assert not (dst / "model.safetensors").exists() and not (dst / CODEC_DIR / "model.safetensors").exists()
    assert (dst / CODEC_DIR / "model.safetensors.index.json").is_file()
    return dst


def _speech(ckpt: Path) -> list[torch.Tensor]:
    request = {"inputs": speech_inputs(ckpt, "Shards."), "sampling": greedy(12)}
    with Engine.from_model("qwen3tts", weights=ckpt) as engine:
        (out,) = engine.run_batch([request])
    assert out.error is None, out.error
    return [out.cat("audio"), *out.signals["codes"]]


def test_sharded_checkpoint_serves_the_single_files_audio(tiny_ckpt: Path, tmp_path: Path) -> None:
    sharded = sharded_copy(tiny_ckpt, tmp_path / "sharded")
    want, got = _speech(tiny_ckpt), _speech(sharded)
    assert want[0].numel() > 0 and len(want) == len(got)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_base_checkpoint(tmp_path_factory.mktemp("qwen3tts-base"))


def _encoded(ckpt: Path) -> tuple[torch.Tensor, torch.Tensor]:
    config = load_config(ckpt)
    speaker, codec = build_speaker_encoder(config, ckpt, "cpu"), build_codec_encoder(config, ckpt, "cpu")
    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(1, 40, speaker.encoder.cfg.mel_dim, generator=gen)
    wave = torch.randn(1, 4800, generator=gen) * 0.1
    with torch.no_grad():
        return speaker.encode(mel), codec.encode(wave)


def test_sharded_base_checkpoint_encodes_like_the_single_files(base_ckpt: Path, tmp_path: Path) -> None:
    sharded = sharded_copy(base_ckpt, tmp_path / "sharded")
    (want_speaker, want_codes), (got_speaker, got_codes) = _encoded(base_ckpt), _encoded(sharded)
    assert torch.equal(want_speaker, got_speaker) and torch.equal(want_codes, got_codes)
