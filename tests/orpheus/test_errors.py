"""Bad requests and bad checkpoints fail with messages that say what is wrong."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from mstar.weights import CheckpointMismatchError
from mstar_orpheus.config import load_config
from mstar_orpheus.plugin import mstar_node_factories
from mstar_orpheus.prompt import VOICES
from safetensors.torch import load_file, save_file


def test_unknown_voice_lists_the_voices(prompts):
    with pytest.raises(ValueError, match="unknown voice 'bob'") as exc:
        prompts.encode("hello", "bob")
    assert all(v in str(exc.value) for v in VOICES)


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_input_is_rejected(prompts, text):
    with pytest.raises(ValueError, match="empty"):
        prompts.encode(text, "tara")


def test_input_beyond_the_model_length_is_rejected(prompts):
    with pytest.raises(ValueError, match="at most 1024 positions"):
        prompts.encode("word " * 400, "tara")


def test_engine_rejects_empty_and_overlong_prompts_alone(quiet_ckpt, engines, prompts):
    engine = engines(quiet_ckpt)
    good = {"inputs": {"prompt_ids": prompts.encode("fine", "tara")}, "sampling": {"temperature": 0, "max_tokens": 4}}
    empty = {"inputs": {"prompt_ids": torch.zeros(0, dtype=torch.long)}}
    long = {"inputs": {"prompt_ids": torch.full((1100,), 300)}}
    out = engine.run_batch([empty, good, long])
    assert "the prompt is empty" in out[0].error
    assert out[1].error is None and len(out[1].cat("token")) == 4
    assert "exceeds the model's maximum length of 1024" in out[2].error


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _build(ckpt: Path, node: str):
    config = load_config(ckpt)
    return mstar_node_factories(config)[node](config, ckpt, "cpu")


def test_missing_and_unexpected_lm_keys_are_listed_together(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "bad")
    state = load_file(bad / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(1\): \['model.layers.1.mlp.up_proj.weight'\]\n  unexpected keys \(1\): \['model.layers.1.mlp.extra.weight'\]"):
        _build(bad, "lm")


def test_wrong_shapes_are_listed(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "bad")
    state = load_file(bad / "model.safetensors")
    state["model.norm.weight"] = torch.ones(3)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"shape mismatches \(1\): \['model.norm.weight: checkpoint \[3\] vs model \[64\]'\]"):
        _build(bad, "lm")


def test_sharded_index_naming_a_missing_shard(quiet_ckpt, tmp_path):
    bad = _copy(quiet_ckpt, tmp_path / "bad")
    (bad / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        _build(bad, "lm")


def test_no_weights_at_all(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "bad")
    (bad / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"neither model.safetensors nor a \*.safetensors.index.json"):
        _build(bad, "lm")


def test_snac_checkpoint_missing_a_decoder_key(ckpt, tmp_path):
    bad = _copy(ckpt, tmp_path / "bad")
    state = torch.load(bad / "snac" / "pytorch_model.bin", weights_only=True)
    key = next(k for k in state if k.startswith("decoder.model.2.block.0"))
    del state[key]
    torch.save(state, bad / "snac" / "pytorch_model.bin")
    with pytest.raises(CheckpointMismatchError, match=rf"missing keys \(1\): \['{re.escape(key)}'\]"):
        _build(bad, "snac")


def test_not_an_orpheus_checkpoint(ckpt, tmp_path):
    no_snac = _copy(ckpt, tmp_path / "no-snac")
    shutil.rmtree(no_snac / "snac")
    with pytest.raises(FileNotFoundError, match="SNAC decoder config"):
        load_config(no_snac)
    plain = _copy(ckpt, tmp_path / "plain-llama")
    tok = json.loads((plain / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if not t["content"].startswith("<custom_token_")]
    (plain / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="not an Orpheus tokenizer"):
        load_config(plain)


def test_prompt_equals_the_official_prompt(quiet_ckpt, prompts):
    from orpheus_reference import official_prompt

    for voice, text in [("tara", "Hello."), ("zac", "Ünïcödé — and <laugh> tags!"), ("leah", " leading space")]:
        assert prompts.encode(text, voice).tolist() == official_prompt(quiet_ckpt, text, voice)


def test_adapter_survives_pickling_for_the_preprocess_pool(quiet_ckpt):
    import pickle

    from mstar.api.protocol import SpeechRequest
    from mstar_orpheus.adapter import OrpheusApiAdapter

    adapter = OrpheusApiAdapter(load_config(quiet_ckpt), quiet_ckpt)
    request = SpeechRequest(model="orpheus", input="Pickled.", voice="dan")
    before = adapter.speech_inputs(request).inputs["prompt_ids"]
    after = pickle.loads(pickle.dumps(adapter)).speech_inputs(request).inputs["prompt_ids"]
    assert torch.equal(before, after) and adapter.sample_rate == 24000
