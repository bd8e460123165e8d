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


def test_graph_validates_with_encoders_beside_the_thinker(omni_ckpt, tmp_path):
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint

    config = plugin._load_config(omni_ckpt)
    graph = plugin.build_graph(config)
    graph.validate()
    assert set(graph.nodes) == {"thinker", "audio_encoder", "vision_encoder", "talker", "code2wav"}
    assert graph.partitions == ("thinker", "talker", "code2wav")
    # transformers' generate passes thinker_eos_token_id=151645 over generation_config.json's
    # [151645, 151643] (the tiny writer's), so <|endoftext|> alone does not stop it either.
    assert config["generation_config"]["eos_token_id"] == [151645, 151643]
    assert plugin.mstar_node_samplers(config)["thinker"].stop_token_ids == (151645,)
    # A Thinker-only checkpoint (the -Thinking / -Captioner releases) has no speech nodes.
    thinker_only = plugin._load_config(write_checkpoint(tmp_path, speech=False, processor=False))
    graph = plugin.build_graph(thinker_only)
    graph.validate()
    assert set(graph.nodes) == {"thinker", "audio_encoder", "vision_encoder"}
    with pytest.raises(ValueError, match="no Talker"):
        graph.state_machine.first_walk("thinker", {"modalities": ["text", "audio"]})
    from mstar_qwen3omni.thinker_node import ThinkerNode

    assert ThinkerNode(thinker_only).accept_layer is None  # its default talker_config is not read
    assert ThinkerNode(config).accept_layer == config["talker_config"]["accept_hidden_layer"]


def test_speech_walks_follow_the_requested_modalities():
    walks = plugin.ThinkerWalks(("ethan", "chelsie"))
    speech = {"modalities": ["text", "audio"], "media": ["image"]}
    assert walks.order(speech) == ("encode_image", "speech_prefill", "speech_decode")
    assert walks.first_walk("talker", speech) == "talker_prefill"
    assert walks.next_walk("talker", "talker_prefill", speech) == "talker_decode"
    assert walks.first_walk("code2wav", speech) == "vocode"
    for text in ({}, {"modalities": ["text"]}):
        assert walks.order(text) == ("prefill", "decode")
        assert walks.first_walk("talker", text) is None and walks.first_walk("code2wav", text) is None
    assert walks.first_walk("talker", {**speech, "voice": "CHELSIE"}) == "talker_prefill"
    with pytest.raises(ValueError, match="unknown voice 'x'.*ethan"):
        walks.first_walk("talker", {**speech, "voice": "x"})


def test_bad_media_requests_fail_alone(omni_ckpt, omni_engines):
    import torch

    engine = omni_engines(omni_ckpt)
    ids = torch.tensor([151644, 872, 198, 100, 151645, 198, 151644, 77091, 198])
    image_prompt = torch.tensor([151644, 872, 198, 151652, *[151655] * 4, 151653, 151645, 198])
    greedy = {"thinker": {"temperature": 0, "max_tokens": 2}}  # a speech checkpoint samples on two nodes
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
