"""Planning with the AC predictor: score candidate action sequences against a goal, and
the cross-entropy method (CEM) that re-samples candidates around the best ones, as in
upstream's planning notebook (``notebooks/utils/mpc_utils.cem``).

A request's K candidates run as one batch through ``rollout_cached``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar_vjepa2.ac_predictor import ACPredictor
from mstar_vjepa2.rollout import rollout_cached

OBJECTIVES = ("l1", "l2", "cosine")


def costs(final: torch.Tensor, goal: torch.Tensor, objective: str) -> torch.Tensor:
    """final [K, N, E] vs goal [N, E] → [K]. ``l1``: mean absolute difference (upstream's);
    ``l2``: Euclidean distance; ``cosine``: 1 − cosine similarity (flattened latents)."""
    diff_in = final.flatten(1)
    goal_flat = goal.reshape(1, -1).to(diff_in.dtype)
    if objective == "l1":
        return (diff_in - goal_flat).abs().mean(dim=1)
    if objective == "l2":
        return (diff_in - goal_flat).norm(dim=1)
    if objective == "cosine":
        return 1.0 - torch.nn.functional.cosine_similarity(diff_in, goal_flat, dim=1)
    raise ValueError(f"objective: {objective!r} is not one of {list(OBJECTIVES)}")


def score(model: ACPredictor, context: torch.Tensor, context_actions: torch.Tensor, states: torch.Tensor,
          candidates: torch.Tensor, goal: torch.Tensor, objective: str) -> torch.Tensor:
    """context [Tc, N, E], context_actions [Tc-1, A], states [Tc, A], candidates [K, H, A]
    → cost of each candidate's last predicted frame [K]."""
    k, horizon = candidates.shape[:2]
    actions = torch.cat([context_actions.expand(k, -1, -1), candidates], dim=1)
    preds = rollout_cached(model, context.expand(k, -1, -1, -1), actions, states.expand(k, -1, -1), horizon)
    return costs(preds[:, -1], goal, objective)


@dataclass(frozen=True)
class CEMParams:
    """``action_space``: ``full`` samples every action dimension around a mean (start 0,
    std ``init_std``), clipped to ±``maxnorm`` when given. ``droid`` is upstream's notebook
    exactly: 7-d DROID actions with only the position deltas (clipped to ±``maxnorm``,
    default 0.05) and the gripper (clipped to ±0.75, momentum of its own) sampled, rotation
    deltas 0, and the plan's gripper rounded to 0 below 0.25 in magnitude."""

    samples: int = 64
    iterations: int = 3
    topk: int = 8
    horizon: int = 1
    init_std: float = 1.0
    maxnorm: float | None = None
    momentum_mean: float = 0.15
    momentum_std: float = 0.15
    momentum_mean_gripper: float = 0.15
    momentum_std_gripper: float = 0.15
    action_space: str = "full"
    seed: int | None = None  # None: a fresh seed per request (the planner reports it)

    def validate(self, action_dim: int) -> None:
        if self.samples < 2 or self.iterations < 1 or self.horizon < 1:
            raise ValueError("cem: samples >= 2, iterations >= 1 and horizon >= 1 are required")
        if not 1 <= self.topk <= self.samples:
            raise ValueError(f"cem.topk: must lie in [1, samples={self.samples}]")
        if self.action_space not in ("full", "droid"):
            raise ValueError(f"cem.action_space: 'full' or 'droid', got {self.action_space!r}")
        if self.action_space == "droid" and action_dim != 7:
            raise ValueError(f"cem.action_space 'droid' needs 7-d actions; this model's are {action_dim}-d")


def _momentum(new: torch.Tensor, old: torch.Tensor, m: float) -> torch.Tensor:
    return new * (1.0 - m) + old * m


@torch.no_grad()
def cem(model: ACPredictor, context: torch.Tensor, context_actions: torch.Tensor, states: torch.Tensor,
        goal: torch.Tensor, objective: str, p: CEMParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (plan [H, A], costs [K] and candidates [K, H, A] of the last iteration).
    Sampling uses its own generator seeded by ``p.seed``: reproducible; in ``droid`` space
    the draws are those of upstream's ``cem`` after ``torch.manual_seed(p.seed)``."""
    droid = p.action_space == "droid"
    device = context.device
    assert p.seed is not None, "the planner draws a seed before calling cem"
    gen = torch.Generator(device=device).manual_seed(p.seed)
    width = 4 if droid else model.cfg.action_dim  # droid: dx, dy, dz, gripper
    maxnorm = 0.05 if droid and p.maxnorm is None else p.maxnorm
    mean = torch.zeros(p.horizon, width, device=device)
    std = torch.full((p.horizon, width), p.init_std, device=device)
    if droid:
        std[:, :3] = maxnorm
        std[:, 3] = 1.0
    for _ in range(p.iterations):
        # One draw per horizon step, in upstream's order.
        draws = torch.stack([torch.randn(p.samples, width, generator=gen, device=device) * std[h] + mean[h]
                             for h in range(p.horizon)], dim=1)
        if droid:
            xyz, grip = draws[..., :3].clamp(-maxnorm, maxnorm), draws[..., 3:].clamp(-0.75, 0.75)
            cand = torch.cat([xyz, torch.zeros_like(xyz), grip], dim=-1)
        else:
            cand = draws if maxnorm is None else draws.clamp(-maxnorm, maxnorm)
        c = score(model, context, context_actions, states, cand, goal, objective)
        best = cand[c.topk(p.topk, largest=False).indices]
        sel_mean, sel_std = best.mean(0), best.std(0, unbiased=p.topk > 1)
        if droid:
            mean = torch.cat([_momentum(sel_mean[:, :3], mean[:, :3], p.momentum_mean),
                              _momentum(sel_mean[:, -1:], mean[:, -1:], p.momentum_mean_gripper)], dim=-1)
            std = torch.cat([_momentum(sel_std[:, :3], std[:, :3], p.momentum_std),
                             _momentum(sel_std[:, -1:], std[:, -1:], p.momentum_std_gripper)], dim=-1)
        else:
            mean, std = _momentum(sel_mean, mean, p.momentum_mean), _momentum(sel_std, std, p.momentum_std)
    if droid:
        grip = torch.where(mean[:, 3:].abs() < 0.25, torch.zeros_like(mean[:, 3:]), mean[:, 3:])
        return torch.cat([mean[:, :3], torch.zeros_like(mean[:, :3]), grip], dim=-1), c, cand
    return mean, c, cand
