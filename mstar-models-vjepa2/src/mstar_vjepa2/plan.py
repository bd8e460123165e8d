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
    samples: int = 64
    iterations: int = 3
    topk: int = 8
    horizon: int = 1
    init_std: float = 1.0
    maxnorm: float | None = None  # clip every sampled action value to [-maxnorm, maxnorm]
    momentum_mean: float = 0.15
    momentum_std: float = 0.15
    seed: int = 0

    def validate(self) -> None:
        if self.samples < 2 or self.iterations < 1 or self.horizon < 1:
            raise ValueError("cem: samples >= 2, iterations >= 1 and horizon >= 1 are required")
        if not 1 <= self.topk <= self.samples:
            raise ValueError(f"cem.topk: must lie in [1, samples={self.samples}]")


@torch.no_grad()
def cem(model: ACPredictor, context: torch.Tensor, context_actions: torch.Tensor, states: torch.Tensor,
        goal: torch.Tensor, objective: str, p: CEMParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (plan [H, A]: the final mean, costs [K] and candidates [K, H, A] of the last
    iteration). Sampling uses its own generator seeded by ``p.seed``: reproducible."""
    a = model.cfg.action_dim
    device = context.device
    gen = torch.Generator(device=device).manual_seed(p.seed)
    mean = torch.zeros(p.horizon, a, device=device)
    std = torch.full((p.horizon, a), p.init_std, device=device)
    for _ in range(p.iterations):
        cand = mean + std * torch.randn(p.samples, p.horizon, a, generator=gen, device=device)
        if p.maxnorm is not None:
            cand = cand.clamp(-p.maxnorm, p.maxnorm)
        c = score(model, context, context_actions, states, cand, goal, objective)
        best = cand[c.topk(p.topk, largest=False).indices]
        mean = best.mean(0) * (1.0 - p.momentum_mean) + mean * p.momentum_mean
        std = best.std(0, unbiased=p.topk > 1) * (1.0 - p.momentum_std) + std * p.momentum_std
    return mean, c, cand
