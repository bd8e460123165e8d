"""Config from the three JSON files, checked at load time; strict weight loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.weights import CheckpointMismatchError, load_weights
from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS, talker_keys
from mstar_qwen3tts.codec_node import CodecNode
from mstar_qwen3tts.config import ConfigError, Qwen3TTSConfig, load_config
from mstar_qwen3tts.plugin import mstar_node_samplers
from mstar_qwen3tts.talker import Talker
from safetensors.torch import load_file, save_file


@pytest.fixture
def ckpt(tiny_ckpt: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _edit_weights(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_config_reads_all_three_files(tiny_cfg) -> None:
    assert tiny_cfg.talker.hidden_size == 32 and tiny_cfg.talker.predictor.hidden_size == 16
    assert tiny_cfg.codec.samples_per_frame == 48 and tiny_cfg.codec.sample_rate == 24000
    assert tiny_cfg.sampling.max_new_tokens == 48 and tiny_cfg.sampling.repetition_penalty == 1.05
    assert tiny_cfg.streaming.left_context == tiny_cfg.codec.receptive_field_frames()


def test_sampler_defaults_follow_generation_config(ckpt: Path) -> None:
    decl = mstar_node_samplers(load_config(ckpt))["talker"]
    assert (decl.main.temperature, decl.main.top_k, decl.main.repetition_penalty, decl.main.min_tokens) == (0.9, 50, 1.05, 2)
    assert decl.aux["code_predictor"].temperature == 0.9 and decl.aux_vocab_sizes["code_predictor"] == 64
    _edit_json(ckpt / "generation_config.json", lambda d: d.update(do_sample=False, subtalker_dosample=False, subtalker_top_k=7))
    decl = mstar_node_samplers(load_config(ckpt))["talker"]
    assert decl.main.temperature == 0.0 and decl.aux["code_predictor"].temperature == 0.0
    assert decl.aux["code_predictor"].top_k == 7


@pytest.mark.parametrize(
    ("file", "edit", "match"),
    [
        ("config.json", lambda d: d.update(tts_model_type="voice_clone"), "tts_model_type"),
        ("config.json", lambda d: d["talker_config"].pop("hidden_size"), "talker_config: missing 'hidden_size'"),
        ("config.json", lambda d: d["talker_config"].update(hidden_act="gelu"), "hidden_act"),
        ("config.json", lambda d: d["talker_config"]["spk_id"].update(vivian=99999), "spk_id.vivian"),
        ("config.json", lambda d: d["talker_config"]["code_predictor_config"].update(num_code_groups=8), "num_code_groups"),
        ("speech_tokenizer/config.json", lambda d: d["decoder_config"].update(num_quantizers=8), "num_quantizers"),
        ("speech_tokenizer/config.json", lambda d: d.update(decode_upsample_rate=1000), "decode_upsample_rate"),
        ("speech_tokenizer/config.json", lambda d: d.update(model_type="qwen3_tts_tokenizer_25hz"), "12 Hz"),
    ],
)
def test_bad_config_fails_at_load_naming_it(ckpt: Path, file: str, edit, match: str) -> None:
    _edit_json(ckpt / file, edit)
    with pytest.raises(ConfigError, match=match):
        load_config(ckpt)


def test_missing_speech_tokenizer_config(ckpt: Path) -> None:
    (ckpt / "speech_tokenizer" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="speech_tokenizer/config.json"):
        load_config(ckpt)


def load_talker(talker: Talker, ckpt: Path) -> None:
    load_weights(talker, ckpt, **talker_keys(base=False))


def load_codec(codec: CodecNode, ckpt: Path) -> None:
    load_weights(codec, ckpt / CODEC_DIR, **CODEC_KEYS)


def test_weights_load_strictly(ckpt: Path, tiny_cfg: Qwen3TTSConfig) -> None:
    talker, codec = Talker(tiny_cfg), CodecNode(tiny_cfg.codec)
    load_talker(talker, ckpt)
    load_codec(codec, ckpt)
    want = load_file(str(ckpt / "model.safetensors"))["talker.codec_head.weight"]
    assert torch.equal(talker.codec_head.weight, want)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t.pop("talker.model.layers.1.self_attn.k_norm.weight"), "missing keys.*k_norm"),
        (lambda t: t.update({"talker.model.extra.weight": torch.zeros(1)}), "unexpected keys.*talker.model.extra"),
        (lambda t: t.update({"speaker_encoder.fc.weight": torch.zeros(1)}), "unexpected keys.*speaker_encoder"),
        (lambda t: t.update({"talker.codec_head.weight": torch.zeros(3, 3)}), "shape mismatches.*codec_head"),
        (lambda t: t.update({"stray.weight": torch.zeros(1)}), r"unexpected keys \(1\): \['stray.weight'\]"),
    ],
)
def test_talker_weights_strict_errors(ckpt: Path, tiny_cfg: Qwen3TTSConfig, edit, match: str) -> None:
    _edit_weights(ckpt / "model.safetensors", edit)
    with pytest.raises(CheckpointMismatchError, match=match):
        load_talker(Talker(tiny_cfg), ckpt)


def test_codec_skips_the_encoder_but_nothing_else(ckpt: Path, tiny_cfg: Qwen3TTSConfig) -> None:
    path = ckpt / "speech_tokenizer" / "model.safetensors"
    _edit_weights(path, lambda t: t.update({"encoder.quantizer.input_proj.weight": torch.zeros(2)}))
    load_codec(CodecNode(tiny_cfg.codec), ckpt)  # the audio encoder (voice clone) is not served
    _edit_weights(path, lambda t: t.update({"quantizer.stray": torch.zeros(2)}))
    with pytest.raises(CheckpointMismatchError, match="unexpected keys.*quantizer.stray"):
        load_codec(CodecNode(tiny_cfg.codec), ckpt)
    _edit_weights(path, lambda t: (t.pop("quantizer.stray"), t.pop("decoder.pre_conv.conv.bias")))
    with pytest.raises(CheckpointMismatchError, match="missing keys.*pre_conv"):
        load_codec(CodecNode(tiny_cfg.codec), ckpt)


def test_engine_refuses_a_broken_checkpoint(ckpt: Path) -> None:
    _edit_weights(ckpt / "model.safetensors", lambda t: t.pop("talker.codec_head.weight"))
    with pytest.raises(CheckpointMismatchError, match="codec_head"):
        Engine.from_model("qwen3tts", weights=ckpt)
