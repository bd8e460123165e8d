"""V-JEPA 2-AC vs upstream ``facebookresearch/vjepa2`` on the same tiny random weights
(fixtures written by mstar-models-vjepa2/tools/make_fixtures.sh from upstream's code)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar_vjepa2.ac_predictor import ACPredictor
from mstar_vjepa2.checkpoint_ac import (
    ac_config,
    encoder_config,
    infer_config,
    load_encoder,
    load_predictor,
)
from mstar_vjepa2.rollout import next_state, normalize, rollout_cached, rollout_recompute
from mstar_vjepa2.vit import Encoder
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures"
TOL = 1e-4


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURES / "ac_reference.safetensors"))


@pytest.fixture(scope="module")
def models():
    cfg = infer_config(FIXTURES / "ac_tiny")
    enc = Encoder(encoder_config(cfg)).eval()
    load_encoder(enc, FIXTURES / "ac_tiny")
    pred = ACPredictor(ac_config(cfg)).eval()
    load_predictor(pred, FIXTURES / "ac_tiny")
    return enc, pred


@torch.no_grad()
def test_encoder_renamed_from_upstream_keys_matches(models, ref):
    enc, _ = models
    frames = ref["frames"]  # [T, C, H, W]: each frame is its own 2-frame clip
    clips = frames.unsqueeze(1).repeat(1, 2, 1, 1, 1)
    lat, _ = enc(clips)
    got = normalize(lat).reshape(1, -1, lat.shape[-1])
    assert (got - ref["encoded"]).abs().max().item() < TOL


@torch.no_grad()
def test_one_shot_frame_causal_forward_matches(models, ref):
    _, pred = models
    out = pred(ref["oneshot_latents"], ref["oneshot_actions"], ref["oneshot_states"])
    assert (out - ref["oneshot_out"]).abs().max().item() < TOL


@torch.no_grad()
@pytest.mark.parametrize("rollout", [rollout_cached, rollout_recompute])
def test_rollout_matches_upstream_recompute(models, ref, rollout):
    _, pred = models
    want = ref["rollout_out"]
    got = rollout(pred, ref["rollout_context"], ref["rollout_actions"], ref["rollout_states"], want.shape[1])
    assert (got - want).abs().max().item() < TOL


def test_next_state_matches_upstream_pose_update(ref):
    got = next_state(ref["pose_in"].double(), ref["pose_action"].double()).float()
    assert (got - ref["pose_out"]).abs().max().item() < 1e-5


def test_cem_in_droid_space_equals_upstreams_notebook(models, ref):
    """Same weights, same seed: upstream's mpc_utils.cem (2-step rollouts, 3 iterations of
    16 samples, top 4) and ours give the same plan."""
    from mstar_vjepa2.plan import CEMParams, cem

    _, pred = models
    ctx = ref["rollout_context"][0, :1]
    goal = ref["rollout_out"][0, 1]
    params = CEMParams(samples=16, iterations=3, topk=4, horizon=2, maxnorm=0.05, action_space="droid", seed=123)
    plan, _, _ = cem(pred, ctx, torch.zeros(0, 7), ref["rollout_states"][0, :1], goal, "l1", params)
    assert (plan - ref["cem_plan"]).abs().max().item() < 1e-5
