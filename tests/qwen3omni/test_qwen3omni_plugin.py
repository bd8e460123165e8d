"""The plugin's per-request walk choice, offload policy and graph."""

from __future__ import annotations

import pytest
from mstar.api.protocol import ChatCompletionRequest
from mstar_qwen3omni import plugin


def test_walks_follow_the_request_media():
    walks = plugin.ThinkerWalks()
    assert walks.order({}) == ("prefill", "decode")
    assert walks.order({"media": ["video", "audio"]}) == ("encode_audio", "encode_video", "prefill", "decode")
    assert walks.first_walk("thinker", {"media": ["image"]}) == "encode_image"
    assert walks.next_walk("thinker", "encode_image", {"media": ["image"]}) == "prefill"
    assert walks.next_walk("thinker", "decode", {}) is None
    with pytest.raises(ValueError, match="unknown media kind"):
        walks.order({"media": ["smell"]})


def test_media_is_preprocessed_in_the_pool_text_inline():
    text = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    image = ChatCompletionRequest(model="m", messages=[
        {"role": "user", "content": "earlier"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
    ])
    assert plugin.mstar_offload_preprocess("qwen3omni", text) is False
    assert plugin.mstar_offload_preprocess("qwen3omni", image) is True
    assert plugin.mstar_offload_preprocess("qwen3omni", object()) is None  # not a chat: core's default


def test_graph_validates_with_encoders_beside_the_thinker(omni_ckpt):
    config = plugin._load_config(omni_ckpt)
    graph = plugin.build_graph(config)
    graph.validate()
    assert set(graph.nodes) == {"thinker", "audio_encoder", "vision_encoder"}
    assert plugin.mstar_node_samplers(config)["thinker"].stop_token_ids == (151645, 151643)
