"""``vjepa2ac`` through the real engine: the rollout runs on M*'s paged KV cache one frame
per step and equals upstream's full-sequence recompute (fixtures from upstream's code);
encoding equals upstream's encoder; planning scores K candidates in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.testing.conformance import assert_conformant
from mstar_vjepa2.ac_predictor import ACPredictor
from mstar_vjepa2.checkpoint_ac import ac_config, infer_config, load_predictor
from mstar_vjepa2.plan import costs
from mstar_vjepa2.rollout import rollout_recompute
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"
CKPT = FIXTURES / "ac_tiny"
TOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURES / "ac_reference.safetensors"))


@pytest.fixture(scope="module")
def engine():
    with Engine.from_model("vjepa2-ac", weights=CKPT) as eng:
        yield eng


@pytest.fixture(scope="module")
def predictor():
    model = ACPredictor(ac_config(infer_config(CKPT))).eval()
    load_predictor(model, CKPT)
    return model


def _rollout_request(ref, b):
    ctx = ref["rollout_context"][b]
    return {"inputs": {"latents": ctx.flatten(0, 1), "actions": ref["rollout_actions"][b], "states": ref["rollout_states"][b]},
            "kwargs": {"task": "rollout_latents"}}


def test_plugin_conformance():
    assert_conformant("vjepa2-ac")


def test_kv_cached_rollout_equals_upstream_recompute(engine, ref):
    want = ref["rollout_out"]  # [B, horizon, N, E]
    outs = engine.run_batch([_rollout_request(ref, b) for b in range(want.shape[0])])
    for b, out in enumerate(outs):
        assert out.error is None, out.error
        got = torch.cat(out.signals["prediction"])
        assert got.shape == want[b].shape
        assert (got - want[b]).abs().max().item() < TOL
        assert out.finish_reason == "stop"


def test_rollout_streams_one_prediction_per_step(engine, ref):
    events = [e for e in engine.generate(**_rollout_request(ref, 1)) if e.signal == "prediction"]
    assert len(events) == ref["rollout_out"].shape[1]
    for h, e in enumerate(events):
        assert (e.data[0] - ref["rollout_out"][1, h]).abs().max().item() < TOL


def test_encode_equals_upstream_encoder(engine, ref):
    (out,) = engine.run_batch([{"inputs": {"video": ref["frames"]}, "kwargs": {"task": "encode"}}])
    assert out.error is None, out.error
    assert (out.signals["latents"][0] - ref["encoded"][0]).abs().max().item() < TOL


def test_plan_scores_k_candidates_like_a_recompute_rollout(engine, ref, predictor):
    ctx = ref["rollout_context"][0]  # 2 context frames
    states = ref["rollout_states"][0]
    ctx_actions = ref["rollout_actions"][0][:1]
    goal = ref["rollout_out"][1, -1]
    cand = 0.3 * torch.randn(8, 3, 7, generator=torch.Generator().manual_seed(4))
    for objective in ("l1", "l2", "cosine"):
        (out,) = engine.run_batch([{
            "inputs": {"latents": ctx.flatten(0, 1), "actions": ctx_actions, "states": states, "goal_latents": goal,
                       "candidates": cand},
            "kwargs": {"task": "plan_latents", "objective": objective}}])
        assert out.error is None, out.error
        actions = torch.cat([ctx_actions.expand(8, -1, -1), cand], dim=1)
        final = rollout_recompute(predictor, ctx.expand(8, -1, -1, -1), actions, states.expand(8, -1, -1), 3)[:, -1]
        want = costs(final, goal, objective)
        got = out.signals["costs"][0]
        assert got.shape == (8,)
        assert (got - want).abs().max().item() < 1e-5
        assert int(out.signals["best_index"][0]) == int(want.argmin())
        assert torch.equal(out.signals["plan_actions"][0], cand[int(want.argmin())])


def test_cem_is_seeded_and_beats_its_first_samples(engine, ref):
    ctx = ref["rollout_context"][0][:1]
    states = ref["rollout_states"][0][:1]
    goal = ref["rollout_out"][0, 1]
    req = {"inputs": {"latents": ctx.flatten(0, 1), "states": states, "goal_latents": goal},
           "kwargs": {"task": "plan_latents", "cem": {"samples": 16, "iterations": 4, "topk": 4, "horizon": 2, "init_std": 0.3, "seed": 7}}}
    a, b = engine.run_batch([req, req])
    assert a.error is None, a.error
    assert torch.equal(a.signals["plan_actions"][0], b.signals["plan_actions"][0])
    assert int(a.signals["cem_seed"][0]) == 7
    unseeded = {**req, "kwargs": {**req["kwargs"], "cem": {k: v for k, v in req["kwargs"]["cem"].items() if k != "seed"}}}
    c, d = engine.run_batch([unseeded, unseeded])
    assert int(c.signals["cem_seed"][0]) != int(d.signals["cem_seed"][0])
    again = {**req, "kwargs": {**req["kwargs"], "cem": {**req["kwargs"]["cem"], "seed": int(c.signals["cem_seed"][0])}}}
    (e,) = engine.run_batch([again])
    assert torch.equal(e.signals["plan_actions"][0], c.signals["plan_actions"][0])
    assert a.signals["plan_actions"][0].shape == (2, 7)
    first = dict(req, kwargs={**req["kwargs"], "cem": {**req["kwargs"]["cem"], "iterations": 1}})
    (one,) = engine.run_batch([first])
    assert a.signals["costs"][0].mean() < one.signals["costs"][0].mean()


@pytest.mark.parametrize(("inputs", "needle"), [
    ({"actions": torch.zeros(3, 6)}, "action dimension 7"),
    ({"actions": torch.zeros(1, 7)}, "actions: 1 rows given"),
    ({"states": torch.zeros(2, 3)}, "states: expected"),
])
def test_bad_rollout_inputs_fail_alone(engine, ref, inputs, needle):
    good = _rollout_request(ref, 0)
    bad = {"inputs": {**good["inputs"], **inputs}, "kwargs": good["kwargs"]}
    ok, err = engine.run_batch([good, bad])
    assert ok.error is None and len(ok.signals["prediction"]) == 3
    assert err.error is not None and needle in err.error


@pytest.mark.parametrize("budget", [20, 50, 130])
def test_chunked_prefill_cuts_only_between_frames(ref, budget):
    # Budgets that are not multiples of a frame: chunks end on frame boundaries (the node's
    # chunk_unit), so the rollout equals the reference; a budget below one frame still
    # makes progress one frame at a time.
    want = ref["rollout_out"]
    with Engine.from_model("vjepa2-ac", weights=CKPT, max_num_batched_tokens=budget) as eng:
        outs = eng.run_batch([_rollout_request(ref, b) for b in range(want.shape[0])])
    for b, out in enumerate(outs):
        assert out.error is None, out.error
        assert (torch.cat(out.signals["prediction"]) - want[b]).abs().max().item() < TOL


def test_preempted_rollouts_replay_to_the_same_predictions(ref):
    # 8 blocks of 16 positions hold fewer frames than two rollouts need at once: one is
    # preempted, its frames are replayed from its history, and nothing changes.
    want = ref["rollout_out"]
    with Engine.from_model("vjepa2-ac", weights=CKPT, kv_budget_bytes=8 * 16 * 2 * 2 * 48 * 4, block_size=16) as eng:
        outs = eng.run_batch([_rollout_request(ref, b) for b in range(want.shape[0])])
        assert eng.stats()["preemptions"] > 0
    for b, out in enumerate(outs):
        assert out.error is None, out.error
        assert (torch.cat(out.signals["prediction"]) - want[b]).abs().max().item() < TOL


def test_rollouts_of_different_context_lengths_batch_together(engine, ref, predictor):
    gen = torch.Generator().manual_seed(12)
    reqs, wants = [], []
    for tc, horizon in ((1, 4), (3, 2), (2, 3)):
        ctx = ref["rollout_context"][0][:1].repeat(tc, 1, 1) + 0.1 * torch.randn(tc, 16, 48, generator=gen)
        actions = 0.2 * torch.randn(tc - 1 + horizon, 7, generator=gen)
        states = torch.rand(tc, 7, generator=gen)
        reqs.append({"inputs": {"latents": ctx.flatten(0, 1), "actions": actions, "states": states},
                     "kwargs": {"task": "rollout_latents"}})
        wants.append(rollout_recompute(predictor, ctx[None], actions[None], states[None], horizon)[0])
    for out, want in zip(engine.run_batch(reqs), wants, strict=True):
        assert out.error is None, out.error
        assert (torch.cat(out.signals["prediction"]) - want).abs().max().item() < TOL
