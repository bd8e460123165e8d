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


def test_bad_media_requests_fail_alone(omni_ckpt, omni_engines):
    import torch

    engine = omni_engines(omni_ckpt)
    ids = torch.tensor([151644, 872, 198, 100, 151645, 198, 151644, 77091, 198])
    image_prompt = torch.tensor([151644, 872, 198, 151652, *[151655] * 4, 151653, 151645, 198])
    greedy = {"temperature": 0, "max_tokens": 2}
    results = engine.run_batch([
        {"inputs": {"prompt_ids": ids}, "sampling": greedy, "kwargs": {"media": ["smell"]}},
        {"inputs": {"prompt_ids": ids}, "sampling": greedy, "kwargs": {"media": ["image"]}},
        {"inputs": {"prompt_ids": image_prompt}, "sampling": greedy},
        {"inputs": {"prompt_ids": ids}, "sampling": greedy},
    ])
    assert "unknown media kind" in results[0].error
    assert "inputs lack ['pixel_values', 'image_grid_thw']" in results[1].error
    assert "more image placeholders than image inputs" in results[2].error
    assert results[3].error is None and len(results[3].cat("tokens")) == 2
