"""The V-JEPA 2-AC action-conditioned predictor, parameter names as in upstream's
``vjepa2-ac-vitg.pt`` ``predictor`` state dict (``module.`` prefixes stripped).

A frame is ``cond + H·W`` tokens: one action token, one state token (and an extrinsics
token when the checkpoint has one), then the frame's patch latents. Attention is
frame-causal: every token sees all tokens of its own frame and of earlier frames. That is
why a rollout can keep earlier frames' keys and values in a cache and run one frame per
step: a frame's outputs never depend on later frames.

``attend(layer, q, k, v)`` is how a layer attends; three are provided:
``dense_frame_causal`` (one-shot forward of whole sequences), ``DenseFrameCache`` (a
plain growing cache, used by the planner) and the engine's paged backend (``nodes_ac``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mstar_vjepa2 import rope

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer, q, k, v) with q/k/v [B, heads, L, head_dim] → [B, heads, L, head_dim]."""


@dataclass(frozen=True)
class ACConfig:
    embed_dim: int  # encoder latent width
    dim: int  # predictor width
    depth: int
    num_heads: int
    mlp_hidden: int
    action_dim: int
    grid_h: int
    grid_w: int
    use_extrinsics: bool = False
    eps: float = 1e-6

    @property
    def cond_tokens(self) -> int:
        return 3 if self.use_extrinsics else 2

    @property
    def patches(self) -> int:
        return self.grid_h * self.grid_w

    @property
    def tokens_per_frame(self) -> int:
        return self.cond_tokens + self.patches

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


class ACAttention(nn.Module):
    def __init__(self, cfg: ACConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)


class ACMlp(nn.Module):
    def __init__(self, cfg: ACConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.mlp_hidden)
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.dim)


class ACBlock(nn.Module):
    def __init__(self, cfg: ACConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.attn = ACAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.mlp = ACMlp(cfg)


def token_positions(cfg: ACConfig, first_frame: int, num_frames: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(frame, row, col, is_cond) per token of frames first_frame.. (each [L])."""
    tpf = cfg.tokens_per_frame
    idx = torch.arange(num_frames * tpf, device=device)
    frame = first_frame + idx // tpf
    within = idx % tpf - cfg.cond_tokens
    is_cond = within < 0
    patch = within.clamp(min=0)
    return frame, patch // cfg.grid_w, patch % cfg.grid_w, is_cond


class ACPredictor(nn.Module):
    def __init__(self, cfg: ACConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.predictor_embed = nn.Linear(cfg.embed_dim, cfg.dim)
        self.action_encoder = nn.Linear(cfg.action_dim, cfg.dim)
        self.state_encoder = nn.Linear(cfg.action_dim, cfg.dim)
        # Upstream builds this layer in every checkpoint, used or not.
        self.extrinsics_encoder = nn.Linear(cfg.action_dim - 1, cfg.dim)
        self.predictor_blocks = nn.ModuleList([ACBlock(cfg) for _ in range(cfg.depth)])
        self.predictor_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.predictor_proj = nn.Linear(cfg.dim, cfg.embed_dim)

    def embed(self, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
              extrinsics: torch.Tensor | None = None) -> torch.Tensor:
        """latents [B, T, H·W, E], actions/states [B, T, A] → tokens [B, T·tpf, dim]."""
        cond = [self.action_encoder(actions), self.state_encoder(states)]
        if self.cfg.use_extrinsics:
            if extrinsics is None:
                raise ValueError("this checkpoint conditions on extrinsics; pass them")
            cond.append(self.extrinsics_encoder(extrinsics))
        x = self.predictor_embed(latents)
        return torch.cat([torch.stack(cond, dim=2), x], dim=2).flatten(1, 2)

    def rotate(self, t: torch.Tensor, pos: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """RoPE on q or k [B, heads, L, hd]: patches on all three axes, action/state tokens
        on the frame axis only."""
        frame, row, col, is_cond = pos
        full = rope.rotate(t, frame.float(), row.float(), col.float())
        frame_only = rope.rotate(t, frame.float(), None, None)
        return torch.where(is_cond[:, None], frame_only, full)

    def blocks(self, x: torch.Tensor, pos: tuple[torch.Tensor, ...], attend: Attend) -> torch.Tensor:
        """x [B, L, dim] → [B, L, dim] through every block; ``pos`` per token ([L])."""
        b, n, _ = x.shape
        for i, blk in enumerate(self.predictor_blocks):
            y = blk.norm1(x)
            qkv = blk.attn.qkv(y).unflatten(-1, (3, self.cfg.num_heads, -1)).permute(2, 0, 3, 1, 4)
            q, k = self.rotate(qkv[0], pos), self.rotate(qkv[1], pos)
            y = attend(i, q, k, qkv[2]).transpose(1, 2).reshape(b, n, -1)
            x = x + blk.attn.proj(y)
            x = x + blk.mlp.fc2(F.gelu(blk.mlp.fc1(blk.norm2(x))))
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T·tpf, dim] → predicted latents of the next frame per frame [B, T, H·W, E]."""
        b = x.shape[0]
        x = x.view(b, -1, self.cfg.tokens_per_frame, x.shape[-1])[:, :, self.cfg.cond_tokens:]
        return self.predictor_proj(self.predictor_norm(x))

    def forward(self, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
                extrinsics: torch.Tensor | None = None) -> torch.Tensor:
        """One-shot frame-causal forward: latents [B, T·H·W, E] → [B, T·H·W, E]
        (frame t's output predicts frame t+1)."""
        cfg = self.cfg
        b = latents.shape[0]
        t = latents.shape[1] // cfg.patches
        x = self.embed(latents.view(b, t, cfg.patches, -1), actions, states, extrinsics)
        pos = token_positions(cfg, 0, t, x.device)
        mask = frame_causal_mask(pos[0], pos[0])
        out = self.blocks(x, pos, lambda _i, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return self.head(out).flatten(1, 2)


def frame_causal_mask(query_frames: torch.Tensor, key_frames: torch.Tensor) -> torch.Tensor:
    """[Lq, Lk] bool: a query sees every key of its own or an earlier frame."""
    return key_frames[None, :] <= query_frames[:, None]


class DenseFrameCache:
    """A plain per-layer K/V cache over a batch of sequences that grow by whole frames
    together (the planner's K candidates). Call ``begin(query_frames)`` before each
    ``blocks`` pass; ``attend`` appends the pass's K/V, then attends frame-causally."""

    def __init__(self, depth: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * depth
        self.v: list[torch.Tensor | None] = [None] * depth
        self.key_frames: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    def begin(self, query_frames: torch.Tensor) -> None:
        keys = query_frames if self.key_frames is None else torch.cat([self.key_frames, query_frames])
        self.key_frames = keys
        mask = frame_causal_mask(query_frames, keys)
        self.mask = None if bool(mask.all()) else mask  # one new frame sees everything

    def expand(self, batch: int) -> None:
        """Repeat a batch-1 cache (a shared context) for ``batch`` candidates."""
        self.k = [None if k is None else k.expand(batch, -1, -1, -1) for k in self.k]
        self.v = [None if v is None else v.expand(batch, -1, -1, -1) for v in self.v]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        old_k, old_v = self.k[layer], self.v[layer]
        if old_k is not None and old_v is not None:
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
