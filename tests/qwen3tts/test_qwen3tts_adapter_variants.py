"""The API adapter on Base (voice clone), VoiceDesign and CustomVoice-1.7B checkpoints:
request fields → the same prompt inputs as the library calls; bad input → 400 naming the field."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
import torch
from mstar.api import ApiError
from mstar.api.protocol import SpeechRequest
from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
from mstar_qwen3tts.clone_prompt import CloneEncoder
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.encoder_nodes import build_codec_encoder, build_speaker_encoder
from mstar_qwen3tts.prompt import build_clone_prompt, build_prompt, instruct_text
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import token_ids

TEXT = "Hello there, world!"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("qwen3tts-kinds")
    return {
        "base": write_checkpoint(root / "base", kind="base"),
        "design": write_checkpoint(root / "design", kind="voice_design", overrides={"tts_model_size": "1b7"}),
        "instruct": write_checkpoint(root / "instruct", overrides={"tts_model_size": "1b7"}),
    }


@pytest.fixture(scope="module")
def adapters(ckpts):
    return {k: Qwen3TTSApiAdapter(load_config(p), p) for k, p in ckpts.items()}


def _wav(seconds: float = 0.8, rate: int = 16000, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate, format=fmt)
    return buf.getvalue()


def _speech(**fields) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": "qwen3tts", "input": TEXT, **fields})


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("as_data_url", [False, True])
@pytest.mark.parametrize("xvec", [False, True])
def test_clone_request_builds_the_clone_prompt(adapters, ckpts, as_data_url: bool, xvec: bool) -> None:
    raw = _wav()
    b64 = base64.b64encode(raw).decode()
    fields = {"ref_audio": f"data:audio/wav;base64,{b64}" if as_data_url else b64, "language": "english",
              "non_streaming_mode": False}
    fields |= {"x_vector_only_mode": True} if xvec else {"ref_text": "the river"}
    got = adapters["base"].speech_inputs(_speech(**fields))
    wave, rate = sf.read(io.BytesIO(raw), dtype="float32")
    clone = CloneEncoder.from_checkpoint(ckpts["base"]).encode(wave, rate, None if xvec else "the river", xvec)
    assert clone.x_vector_only_mode == xvec
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpts["base"]))
    want = build_clone_prompt(cfg, token_ids(ckpts["base"], TEXT), clone.speaker_embed, clone.ref_codes,
                              clone.ref_text_ids.tolist(), "english", False).inputs()
    # The pool's share: the prompt's id streams and the clip's features; the engine's
    # encoder nodes turn the features into the clone prompt (here: the nodes' encoders).
    ids = ("text_ids", "codec_ids", "trailing_ids")
    assert _equal({k: got.inputs[k] for k in ids}, {k: want[k] for k in ids})
    assert got.kwargs == {"clone_encode": "x_vector_only" if xvec else "in_context"}
    config = load_config(ckpts["base"])
    speaker = build_speaker_encoder(config, ckpts["base"], "cpu")
    assert torch.equal(speaker.encode(got.inputs["ref_mel"][None])[0], want["speaker_embed"])
    if xvec:
        assert "ref_wave" not in got.inputs and got.inputs["ref_codes"].shape == (0, cfg.talker.num_code_groups)
    else:
        codes = build_codec_encoder(config, ckpts["base"], "cpu").encode(got.inputs["ref_wave"][None])[0]
        assert torch.equal(codes, want["ref_codes"]) and codes.shape[0] == 10  # 0.8 s at 12.5 Hz


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({}, "ref_audio", "needs ref_audio"),
        ({"ref_audio": "not base64!!", "ref_text": "hi"}, "ref_audio", "base64"),
        ({"ref_audio": base64.b64encode(b"RIFF garbage").decode(), "ref_text": "hi"}, "ref_audio", "not readable"),
        ({"ref_audio": "data:audio/wav,abc", "ref_text": "hi"}, "ref_audio", "base64"),
        ({"ref_audio": base64.b64encode(_wav(61.0, 8000)).decode(), "x_vector_only_mode": True}, "ref_audio", "at most 60 s"),
        ({"ref_audio": base64.b64encode(_wav()).decode()}, "ref_text", "required"),
        ({"ref_audio": base64.b64encode(_wav()).decode(), "x_vector_only_mode": "yes"}, "x_vector_only_mode", "boolean"),
        ({"ref_audio": base64.b64encode(_wav()).decode(), "ref_text": "hi", "instructions": "whisper"}, "instructions", "no instructions"),
        ({"ref_audio": base64.b64encode(_wav()).decode(), "ref_text": "hi", "voice": "alloy"}, "voice", "unknown voice"),
        ({"ref_audio": base64.b64encode(_wav(0.01)).decode(), "x_vector_only_mode": True}, "ref_audio", "too short"),
    ],
)
def test_bad_clone_requests_name_the_field(adapters, fields, param, words) -> None:
    with pytest.raises(ApiError) as err:
        adapters["base"].speech_inputs(_speech(**fields))
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


def test_voice_design_instructions(adapters, ckpts) -> None:
    got = adapters["design"].speech_inputs(_speech(instructions="A warm, low voice.", language="english"))
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpts["design"]))
    tok = adapters["design"].tokenize
    want = build_prompt(cfg, token_ids(ckpts["design"], TEXT), None, "english", True, tok(instruct_text("A warm, low voice.")))
    assert _equal(got.inputs, want.inputs())
    plain = adapters["design"].speech_inputs(_speech())
    assert len(plain.inputs["text_ids"]) < len(got.inputs["text_ids"])  # no instruction: none in the prompt
    for fields, param in (({"voice": "ryan"}, "voice"), ({"ref_audio": "abc"}, "ref_audio")):
        with pytest.raises(ApiError) as err:
            adapters["design"].speech_inputs(_speech(**fields))
        assert err.value.status == 400 and err.value.param == param


def test_customvoice_1b7_takes_instructions(adapters, ckpts) -> None:
    got = adapters["instruct"].speech_inputs(_speech(voice="eric", instructions="Whisper.", language="chinese"))
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpts["instruct"]))
    instruct = adapters["instruct"].tokenize(instruct_text("Whisper."))
    want = build_prompt(cfg, token_ids(ckpts["instruct"], TEXT), "eric", "chinese", True, instruct)
    assert _equal(got.inputs, want.inputs())
    assert got.inputs["text_ids"][: len(instruct)].tolist() == instruct
    assert (got.inputs["codec_ids"][: len(instruct)] == -1).all()


@pytest.mark.parametrize("kind", ["base", "design", "instruct"])
def test_warmup_request_is_valid(adapters, kind: str) -> None:
    req = adapters[kind].speech_inputs(adapters[kind].warmup_request())
    assert req.inputs["text_ids"].numel() > 0
