"""Autoregressive rollouts of the AC predictor outside the engine (the planner's batched
candidates, and references for tests): full recompute per step, or a dense frame cache.

Conventions (as upstream's world-model wrapper): frame t is encoded, layer-normed
latents; ``actions[t]`` is the action taken from frame t to t+1; the state of a predicted
frame follows from the previous state and action (``next_state``); each prediction is
layer-normed before it is fed back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar_vjepa2.ac_predictor import ACPredictor, DenseFrameCache, token_positions


def normalize(latents: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(latents, (latents.shape[-1],))


def _euler_xyz_to_matrix(angles: torch.Tensor) -> torch.Tensor:
    """Extrinsic x-y-z Euler angles [..., 3] → rotation matrices [..., 3, 3] (Rz·Ry·Rx)."""
    a, b, c = angles.unbind(-1)
    ca, sa, cb, sb, cc, sc = a.cos(), a.sin(), b.cos(), b.sin(), c.cos(), c.sin()
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    rx = torch.stack([one, zero, zero, zero, ca, -sa, zero, sa, ca], -1).unflatten(-1, (3, 3))
    ry = torch.stack([cb, zero, sb, zero, one, zero, -sb, zero, cb], -1).unflatten(-1, (3, 3))
    rz = torch.stack([cc, -sc, zero, sc, cc, zero, zero, zero, one], -1).unflatten(-1, (3, 3))
    return rz @ ry @ rx


def _matrix_to_euler_xyz(m: torch.Tensor) -> torch.Tensor:
    b = torch.asin((-m[..., 2, 0]).clamp(-1.0, 1.0))
    a = torch.atan2(m[..., 2, 1], m[..., 2, 2])
    c = torch.atan2(m[..., 1, 0], m[..., 0, 0])
    return torch.stack([a, b, c], dim=-1)


def next_state(state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """End-effector state after an action (DROID convention, 7 values: xyz, extrinsic xyz
    Euler angles, gripper): positions add, the rotation composes as R(delta)·R(state), the
    gripper adds and clips to [0, 1]. Other widths: states and actions simply add."""
    if state.shape[-1] != 7:
        return state + action
    xyz = state[..., :3] + action[..., :3]
    rot = _matrix_to_euler_xyz(_euler_xyz_to_matrix(action[..., 3:6]) @ _euler_xyz_to_matrix(state[..., 3:6]))
    grip = (state[..., 6:] + action[..., 6:]).clamp(0.0, 1.0)
    return torch.cat([xyz, rot, grip], dim=-1)


@torch.no_grad()
def rollout_recompute(model: ACPredictor, context: torch.Tensor, actions: torch.Tensor,
                      states: torch.Tensor, horizon: int) -> torch.Tensor:
    """Upstream's way: every step runs the whole sequence again.
    context [B, Tc, HW, E] (normalized), actions [B, Tc-1+horizon, A], states [B, Tc, A]
    → predictions [B, horizon, HW, E] (normalized)."""
    frames, st = context, states
    preds = []
    tc = context.shape[1]
    for h in range(horizon):
        t = tc + h
        out = model(frames.flatten(1, 2), actions[:, :t], st).view(frames.shape[0], t, -1, frames.shape[-1])
        nxt = normalize(out[:, -1:])
        preds.append(nxt)
        frames = torch.cat([frames, nxt], dim=1)
        st = torch.cat([st, next_state(st[:, -1:], actions[:, t - 1 : t])], dim=1)
    return torch.cat(preds, dim=1)


@torch.no_grad()
def rollout_cached(model: ACPredictor, context: torch.Tensor, actions: torch.Tensor,
                   states: torch.Tensor, horizon: int, cache: DenseFrameCache | None = None) -> torch.Tensor:
    """The same rollout on a dense frame cache: the context once, then one frame per step."""
    cfg = model.cfg
    b, tc = context.shape[:2]
    cache = cache or DenseFrameCache(cfg.depth)
    x = model.embed(context, actions[:, :tc], states)
    pos = token_positions(cfg, 0, tc, x.device)
    cache.begin(pos[0])
    out = model.head(model.blocks(x, pos, cache.attend))
    nxt = normalize(out[:, -1:])
    state = states[:, -1:]
    preds = [nxt]
    for h in range(1, horizon):
        t = tc + h - 1  # the frame fed this step
        state = next_state(state, actions[:, t - 1 : t])
        x = model.embed(nxt, actions[:, t : t + 1], state)
        pos = token_positions(cfg, t, 1, x.device)
        cache.begin(pos[0])
        nxt = normalize(model.head(model.blocks(x, pos, cache.attend)))
        preds.append(nxt)
    return torch.cat(preds, dim=1)
