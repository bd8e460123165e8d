"""The V-JEPA 2 video ViT (encoder) and its masked predictor, parameter names as in
``transformers``' ``VJEPA2Model`` so its ``model.safetensors`` loads as is.

Both run ragged batches: clips of different lengths (and masks of different sizes) are
padded to the longest and padded keys are masked out of attention. No token sorting: the
predictor's attention has no causal mask, so token order does not change any output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar_vjepa2 import rope
from mstar_vjepa2.config import VitConfig, VJEPA2Config


class RopeSelfAttention(nn.Module):
    def __init__(self, cfg: VitConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, pos: tuple[torch.Tensor, torch.Tensor, torch.Tensor], key_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = x.shape
        heads = (b, n, self.num_heads, -1)
        q = self.query(x).view(heads).transpose(1, 2)
        k = self.key(x).view(heads).transpose(1, 2)
        v = self.value(x).view(heads).transpose(1, 2)
        q, k = rope.rotate(q, *pos), rope.rotate(k, *pos)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: VitConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.mlp_hidden)
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, cfg: VitConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.attention = RopeSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.eps)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor, pos: tuple[torch.Tensor, torch.Tensor, torch.Tensor], key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), pos, key_mask)
        return x + self.mlp(self.norm2(x))


def key_padding_mask(lengths: torch.Tensor, n: int) -> torch.Tensor | None:
    """[B, 1, 1, n] bool (True = attend) or None when no row is padded."""
    if bool((lengths == n).all()):
        return None
    return (torch.arange(n, device=lengths.device) < lengths[:, None])[:, None, None, :]


class PatchEmbeddings(nn.Module):
    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        t, p = cfg.tubelet_size, cfg.patch_size
        self.proj = nn.Conv3d(cfg.in_chans, cfg.encoder.hidden_size, kernel_size=(t, p, p), stride=(t, p, p))


class Embeddings(nn.Module):
    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.patch_embeddings = PatchEmbeddings(cfg)


class Encoder(nn.Module):
    """pixel_values_videos [B, T, C, H, W] → latents [B, N, D], N = T/tubelet · (H/patch)²."""

    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layer = nn.ModuleList([Layer(cfg.encoder) for _ in range(cfg.encoder.num_layers)])
        self.layernorm = nn.LayerNorm(cfg.encoder.hidden_size, eps=cfg.encoder.eps)

    def forward(self, pixels: torch.Tensor, num_frames: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``num_frames`` [B]: each clip's real frame count (the rest is padding).
        Returns the latents and each row's token count."""
        cfg = self.cfg
        b, t = pixels.shape[:2]
        if num_frames is None:
            num_frames = torch.full((b,), t, dtype=torch.long)
        x = pixels.permute(0, 2, 1, 3, 4)
        if t < cfg.tubelet_size:  # too short for one tubelet: repeat, as the reference does
            x = x.repeat(1, 1, cfg.tubelet_size, 1, 1)
        w = self.embeddings.patch_embeddings.proj.weight
        x = self.embeddings.patch_embeddings.proj(x.to(w.dtype)).flatten(2).transpose(1, 2)
        n = x.shape[1]
        lengths = torch.tensor([cfg.num_tokens(int(f)) for f in num_frames], device=x.device)
        grid = cfg.grid
        # Positions use the configured grid (as the reference), one id per token.
        pos = rope.grid_positions(torch.arange(n, device=x.device), grid, grid)
        mask = key_padding_mask(lengths, n)
        for layer in self.layer:
            x = layer(x, pos, mask)
        return self.layernorm(x), lengths


class PredictorEmbeddings(nn.Module):
    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.predictor_embeddings = nn.Linear(cfg.encoder.hidden_size, cfg.predictor.hidden_size)
        self.mask_tokens = nn.Parameter(torch.zeros(cfg.num_mask_tokens, 1, 1, cfg.predictor.hidden_size))


class Predictor(nn.Module):
    """Predicts the latents of target positions from the latents of context positions."""

    MASK_INDEX = 1  # the mask token the reference uses by default

    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = PredictorEmbeddings(cfg)
        self.layer = nn.ModuleList([Layer(cfg.predictor) for _ in range(cfg.predictor.num_layers)])
        self.layernorm = nn.LayerNorm(cfg.predictor.hidden_size, eps=cfg.predictor.eps)
        self.proj = nn.Linear(cfg.predictor.hidden_size, cfg.encoder.hidden_size)

    def forward(
        self,
        latents: torch.Tensor,
        context_ids: torch.Tensor,
        context_len: torch.Tensor,
        target_ids: torch.Tensor,
        target_len: torch.Tensor,
    ) -> torch.Tensor:
        """latents [B, N, D]; context/target ids [B, Nc] / [B, Nt] token indices (padded
        rows beyond their length). Returns predictions [B, Nt, D]."""
        b, nc = context_ids.shape
        nt = target_ids.shape[1]
        picked = latents.gather(1, context_ids[..., None].expand(-1, -1, latents.shape[-1]))
        ctx = self.embeddings.predictor_embeddings(picked)
        token = self.embeddings.mask_tokens[self.MASK_INDEX % self.cfg.num_mask_tokens].reshape(1, 1, -1)
        x = torch.cat([ctx, token.expand(b, nt, -1).to(ctx.dtype)], dim=1)
        ids = torch.cat([context_ids, target_ids], dim=1)
        grid = self.cfg.grid
        pos = tuple(p[:, None, :] for p in rope.grid_positions(ids, grid, grid))
        ar_c, ar_t = torch.arange(nc, device=x.device), torch.arange(nt, device=x.device)
        valid = torch.cat([ar_c < context_len[:, None], ar_t < target_len[:, None]], dim=1)
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        for layer in self.layer:
            x = layer(x, pos, mask)  # type: ignore[arg-type]
        x = self.layernorm(x[:, nc:])
        return self.proj(x)


class VJEPA2(nn.Module):
    """Encoder + predictor under the ``transformers`` key names (``encoder.*``, ``predictor.*``)."""

    def __init__(self, cfg: VJEPA2Config) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        self.predictor = Predictor(cfg)
