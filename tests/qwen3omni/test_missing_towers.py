"""A checkpoint without an encoder tower's weights: the graph has neither the tower's node nor
its walks, the engine serves the other media, and a chat part of the missing kind is a 400
naming the part (as is a media kwarg of that kind at the engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.text.lm import TOKENS
from mstar_qwen3omni.plugin import (
    ENCODERS,
    _example_requests,
    _load_config,
    build_graph,
    mstar_api_adapter,
)
from mstar_qwen3omni.tiny_checkpoint import write_checkpoint
from safetensors.torch import load_file, save_file

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
VIDEO = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}


@pytest.fixture(scope="module")
def no_audio_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with every ``thinker.audio_tower.*`` tensor removed."""
    root = write_checkpoint(tmp_path_factory.mktemp("omni-no-audio"), speech=False)
    weights = root / "model.safetensors"
    state = load_file(weights)
    save_file({k: v for k, v in state.items() if not k.startswith("thinker.audio_tower.")}, weights, metadata={"format": "pt"})
    return root


def _chat(*parts: dict, **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "system", "content": "x"}, {"role": "user", "content": list(parts)}], **extra)


def test_the_graph_leaves_out_the_missing_tower(no_audio_ckpt):
    config = _load_config(no_audio_ckpt)
    assert config[ENCODERS] == ["vision"]
    graph = build_graph(config)
    assert "audio_encoder" not in graph.nodes and "encode_audio" not in graph.walks
    assert {"vision_encoder"} <= set(graph.nodes) and {"encode_image", "encode_video"} <= set(graph.walks)


def test_a_part_of_the_missing_kind_is_a_400_naming_it(no_audio_ckpt):
    adapter = mstar_api_adapter(model_name="qwen3omni", config=_load_config(no_audio_ckpt), checkpoint_dir=no_audio_ckpt)
    for parts, extra, where in [
        ((IMAGE, AUDIO), {}, "messages[1].content[1] (input_audio)"),
        ((VIDEO,), {"use_audio_in_video": True}, "messages[1].content[0] (video_url)"),  # its audio track
    ]:
        with pytest.raises(ApiError) as err:
            adapter.chat_inputs(_chat(*parts, **extra))
        assert err.value.status == 400 and err.value.param == where and "no audio encoder" in err.value.message


def test_the_engine_serves_the_other_media_and_refuses_the_missing_kind(no_audio_ckpt):
    config = _load_config(no_audio_ckpt)
    examples = _example_requests(config)
    assert examples[-1]["kwargs"]["media"] == ["image", "video"]
    with Engine.from_model("qwen3omni", weights=no_audio_ckpt) as engine:
        out = engine.run_batch(examples)
        assert [o.error for o in out] == [None, None] and all(o.cat(TOKENS).numel() == 4 for o in out)
        audio = {**examples[-1], "kwargs": {"media": ["audio"]}}
        [refused] = engine.run_batch([audio])
        assert refused.error and "no encoder for media kind(s) ['audio']" in refused.error


def test_an_unchanged_checkpoint_keeps_both_towers(omni_ckpt):
    assert _load_config(omni_ckpt)[ENCODERS] == ["audio", "vision"]
    assert torch.is_tensor(_example_requests(_load_config(omni_ckpt))[-1]["inputs"]["input_features"])
