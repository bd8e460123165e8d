"""The Thinker LLM through the real engine against transformers' Qwen3-Omni Thinker on the
same checkpoint files: logits of the prefill and 16 decode steps, greedy ids, a ragged batch
mixing text, images, audio and video, and chunked prefill."""

from __future__ import annotations

import pytest
import torch
from thinker_reference import hf_greedy, hf_logits, hf_thinker, make_cases

STEPS = 17  # the prefill's token and 16 decode steps
LOGITS_TOL = 1e-4
GREEDY = {"thinker": {"temperature": 0, "max_tokens": STEPS, "ignore_eos": True}}


@pytest.fixture(scope="module")
def cases(omni_ckpt):
    return make_cases(omni_ckpt)


def _request(case, raw: bool) -> dict:
    """``raw``: the processor's media tensors through M*'s encoder nodes; else the encoder
    outputs of transformers' own towers straight into the Thinker."""
    if not raw:
        return {"inputs": {"prompt_ids": torch.tensor(case.prompt), **case.engine_inputs}, "sampling": GREEDY,
                "kwargs": {"return_logits": True}}
    media = {k: v for k, v in case.hf_inputs.items() if isinstance(v, torch.Tensor)}
    kinds = [kind for kind, key in (("audio", "input_features"), ("image", "pixel_values"), ("video", "pixel_values_videos"))
             if key in media]
    return {"inputs": {"prompt_ids": torch.tensor(case.prompt), **media}, "sampling": GREEDY,
            "kwargs": {"return_logits": True, "media": kinds}}


def _run(engine, cases, raw: bool = False):
    requests = [_request(c, raw) for c in cases]
    results = engine.run_batch(requests)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results


def _check(omni_ckpt, cases, results) -> float:
    worst = 0.0
    for case, result in zip(cases, results, strict=True):
        tokens = result.cat("tokens").tolist()
        assert len(tokens) == STEPS, case.name
        ours = torch.stack(result.signals["logits"])
        ref = hf_logits(omni_ckpt, case, tokens)
        assert ours.shape == ref.shape, case.name
        err = float((ours - ref).abs().max())
        print(f"{case.name}: max |logits - transformers| = {err:.2e}")
        assert err < LOGITS_TOL, case.name
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("budget", [2048, 8], ids=["whole-prefill", "chunked-prefill"])
def test_ragged_multimodal_batch_matches_transformers(omni_ckpt, omni_engines, cases, budget):
    """Every case in one batch (ragged lengths, different media), then each alone: logits of
    the prefill and 16 decode steps within 1e-4 of transformers, with whole and chunked prefill."""
    engine = omni_engines(omni_ckpt, max_num_batched_tokens=budget)
    batch = list(cases.values())
    assert len({len(c.prompt) for c in batch}) >= 5  # ragged
    worst = _check(omni_ckpt, batch, _run(engine, batch))
    print(f"budget {budget}: worst {worst:.2e}")


@pytest.mark.parametrize("budget", [2048, 8], ids=["whole-prefill", "chunked-prefill"])
def test_raw_media_through_the_encoder_nodes_matches_transformers(omni_ckpt, omni_engines, cases, budget):
    """The whole Thinker: processor tensors through M*'s audio and vision encoder nodes (all
    requests' media in one encoder batch) and the LLM, against transformers' Thinker."""
    engine = omni_engines(omni_ckpt, max_num_batched_tokens=budget)
    batch = list(cases.values())
    worst = _check(omni_ckpt, batch, _run(engine, batch, raw=True))
    print(f"raw media, budget {budget}: worst {worst:.2e}")


@pytest.mark.parametrize("name", ["text", "image", "video_with_audio"])
def test_greedy_ids_equal_transformers_generate(omni_ckpt, omni_engines, cases, name):
    engine = omni_engines(omni_ckpt)
    case = cases[name]
    ours = _run(engine, [case], raw=True)[0].cat("tokens").tolist()
    assert ours == hf_greedy(omni_ckpt, case, STEPS)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped-mm", "per-expert"])
def test_moe_routing_and_output_equal_transformers(omni_ckpt, monkeypatch, grouped):
    """Expert choice, routing weights and the block's output against transformers' sparse
    MoE block of the same layer, on the same hidden states (both expert paths)."""
    from mstar_qwen3omni.moe import SparseMoeBlock

    monkeypatch.setattr(SparseMoeBlock, "_use_grouped", lambda self, x: grouped)
    from mstar_qwen3omni.config import load_config
    from mstar_qwen3omni.loading import build_thinker

    node = build_thinker(load_config(omni_ckpt), omni_ckpt, "cpu")
    hf = hf_thinker(str(omni_ckpt)).model.language_model
    x = torch.randn(37, node.text.hidden_size, generator=torch.Generator().manual_seed(0))
    checked = 0
    for i, layer in enumerate(node.lm.model.layers):
        if not node.text.is_sparse(i):
            assert type(hf.layers[i].mlp).__name__.endswith("TextMLP")
            continue
        ref_block = hf.layers[i].mlp
        with torch.no_grad():
            _, ref_weights, ref_experts = ref_block.gate(x)
            experts, weights = layer.mlp.route(x)
            assert torch.equal(experts, ref_experts)
            torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-6)
            torch.testing.assert_close(layer.mlp(x), ref_block(x[None])[0], rtol=0, atol=1e-5)
        checked += 1
    assert checked == 3  # layers 0, 1, 3 (layer 2 is dense)


def test_preempted_multimodal_requests_recompute_exactly(omni_ckpt, omni_engines, cases):
    """A KV pool that holds about one request at a time: requests are preempted and their
    multimodal prefill recomputed (chunk by chunk), and every logit still matches."""
    from mstar_qwen3omni.config import TextConfig, load_config

    text = TextConfig.from_config(load_config(omni_ckpt))
    per_token = 2 * text.num_layers * text.num_kv_heads * text.head_dim * 4
    longest = max(len(c.prompt) for c in cases.values()) + STEPS
    # The budget is split evenly between the KV nodes: the Thinker and the Talker.
    engine = omni_engines(omni_ckpt, kv_budget_bytes=2 * (longest + 32) * per_token, max_num_batched_tokens=16)
    batch = list(cases.values())
    before = engine.stats()["preemptions"]
    worst = _check(omni_ckpt, batch, _run(engine, batch, raw=True))
    assert engine.stats()["preemptions"] > before
    print(f"preempted: {engine.stats()['preemptions'] - before}, worst {worst:.2e}")
