"""Chat messages with media (data URLs / base64) through our Preprocessor give exactly the prompt
ids and processor tensors that transformers' Qwen3OmniMoeProcessor (torchvision video processor
included) produced for the same media and messages. The reference outputs were made in a
throw-away environment by mstar-models-qwen3omni/tools/make_processor_fixtures.py."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import torch
from mstar_qwen3omni.media import MediaLimits
from mstar_qwen3omni.processing import Preprocessor, write_preprocessor_config
from mstar_qwen3omni.tiny_tokenizer import write_tokenizer
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "processor"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
MIME = {".png": "image/png", ".mp4": "video/mp4", ".wav": "audio/wav"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("processor_ckpt")
    write_tokenizer(root)
    write_preprocessor_config(root, **EXPECTED["preprocessor"])
    return root


@pytest.fixture(scope="module")
def preprocessor(checkpoint) -> Preprocessor:
    return Preprocessor.from_checkpoint(checkpoint, MediaLimits(), video_fps=EXPECTED["fps"])


def _inline(messages: list[dict]) -> list[dict]:
    """Replace the fixtures' ``file:NAME`` references by data URLs (bare base64 for input_audio)."""

    def encode(ref: str, data_url: bool) -> str:
        path = FIXTURES / ref.removeprefix("file:")
        b64 = base64.b64encode(path.read_bytes()).decode()
        return f"data:{MIME[path.suffix]};base64,{b64}" if data_url else b64

    out = []
    for message in messages:
        if isinstance(message["content"], list):
            parts = []
            for part in message["content"]:
                kind = part["type"]
                if kind in ("image_url", "video_url"):
                    part = {"type": kind, kind: {"url": encode(part[kind]["url"], True)}}
                elif kind == "input_audio":
                    part = {"type": kind, kind: {**part[kind], "data": encode(part[kind]["data"], False)}}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out


def test_the_tokenizer_is_the_one_the_fixtures_were_made_with(checkpoint):
    assert hashlib.sha256((checkpoint / "tokenizer.json").read_bytes()).hexdigest() == EXPECTED["tokenizer_json_sha256"]


@pytest.mark.parametrize("case", sorted(EXPECTED["cases"]))
def test_prompt_ids_and_every_tensor_equal_transformers(preprocessor, case):
    spec = EXPECTED["cases"][case]
    got = preprocessor(_inline(spec["messages"]), use_audio_in_video=spec["use_audio_in_video"])
    assert got.input_ids == spec["input_ids"]
    rows = load_file(str(FIXTURES / "expected.safetensors"))
    assert sorted(got.tensors) == sorted(spec["tensors"])
    for key, meta in spec["tensors"].items():
        value = torch.as_tensor(got.tensors[key]).contiguous()
        assert list(value.shape) == meta["shape"], key
        assert str(value.dtype) == meta["dtype"], key
        stored = rows[f"{case}.{key}"]
        sampled = value[:: EXPECTED["row_stride"]] if stored.shape != value.shape else value
        assert torch.equal(sampled, stored), f"{key}: max diff {(sampled.double() - stored.double()).abs().max()}"
        assert hashlib.sha256(value.numpy().tobytes()).hexdigest() == meta["sha256"], key
