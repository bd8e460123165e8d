"""The Thinker's vision encoder: a ViT over ``temporal_patch_size x patch_size^2`` patches (a
Conv3d patch embed), a learned square position table resampled bilinearly to each grid, 2-D
rotary attention inside each frame, the final patch merger (``spatial_merge_size^2`` patches ->
one LLM token) and the deepstack mergers whose outputs transformers adds to the hidden states
of the first LLM layers. Sizes come from ``thinker_config.vision_config``; parameter names equal
the checkpoint's ``thinker.visual.*`` keys.

Interface (stateless, batched over any number of images and videos of any grid; no per-image
Python in the math):

    cfg = VisionEncoderConfig.from_dict(config_json["thinker_config"]["vision_config"])
    enc = VisionEncoder(cfg)                     # then mstar.weights.load_weights(enc, ckpt, **VISION_TOWER_KEYS)
    out = enc(pixel_values, grid_thw)            # processor tensors, several requests concatenated
    out.embeds                                   # (sum(t*h*w) / merge^2, out_hidden_size)
    out.deepstack                                # one tensor of that shape per deepstack layer
    counts = vision_token_counts(grid_thw, cfg.spatial_merge_size)   # LLM tokens per image/video
    per_request = enc.encode_requests([(pixel_values, grid_thw), ...])  # list of VisionOutput

``pixel_values`` are the processor's flattened patches, ``(sum(t*h*w), in_channels *
temporal_patch_size * patch_size^2)`` in merge-block order; ``grid_thw`` is ``(items, 3)``.
Each item's output depends only on that item (attention never crosses a frame).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from mstar.layers import apply_rope
from torch import nn

from .media_activation import activation
from .media_attention import SegmentPlan, segment_attention


@dataclass(frozen=True)
class VisionEncoderConfig:
    """``thinker_config.vision_config``; defaults are transformers' for this model."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, d: dict) -> VisionEncoderConfig:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        rope = d.get("rope_parameters") or {}
        if "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        if "deepstack_visual_indexes" in values:
            values["deepstack_visual_indexes"] = tuple(values["deepstack_visual_indexes"])
        return cls(**values)


@dataclass
class VisionOutput:
    embeds: torch.Tensor  # (tokens, out_hidden_size), tokens = sum(t*h*w) / merge^2
    deepstack: list[torch.Tensor]  # one (tokens, out_hidden_size) per deepstack layer


def vision_token_counts(grid_thw: torch.Tensor, spatial_merge_size: int) -> torch.Tensor:
    return grid_thw.prod(-1) // (spatial_merge_size**2)


def _patch_coordinates(grid_thw: torch.Tensor, merge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and column of every patch in merge-block order (block row, block col, row in block,
    col in block), frames one after another; plus each patch's grid height and width."""
    grid = grid_thw.to(torch.long)
    per_item = grid[:, 0] * grid[:, 1] * grid[:, 2]
    heights = torch.repeat_interleave(grid[:, 1], per_item)
    widths = torch.repeat_interleave(grid[:, 2], per_item)
    first = torch.repeat_interleave(torch.cumsum(per_item, 0) - per_item, per_item)
    in_frame = (torch.arange(int(per_item.sum()), device=grid.device) - first) % (heights * widths)
    block, inner = in_frame // (merge * merge), in_frame % (merge * merge)
    blocks_per_row = widths // merge
    rows = (block // blocks_per_row) * merge + inner // merge
    cols = (block % blocks_per_row) * merge + inner % merge
    return rows, cols, heights, widths


def _bilinear_taps(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source rows (2 per target) and weights for resizing ``side`` to ``size`` with corners aligned."""
    src = index.float() * (side - 1) / torch.clamp(size - 1, min=1).float()
    low = src.floor()
    frac = src - low
    taps = torch.stack([low.long(), low.long() + 1], dim=-1).clamp(max=side - 1)
    return taps, torch.stack([1 - frac, frac], dim=-1)


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # Kernel == stride over one patch: the convolution is a linear map of the flattened patch.
        w = self.proj.weight
        return F.linear(patches.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.heads = cfg.num_heads
        self.scale = (cfg.hidden_size // cfg.num_heads) ** -0.5
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: SegmentPlan) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)
        # Rotary in float32, as the reference does, whatever the weights' dtype.
        q = apply_rope(q.float(), cos, sin).to(v.dtype)
        k = apply_rope(k.float(), cos, sin).to(v.dtype)
        return self.proj(segment_attention(q, k, v, plan, self.scale).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: SegmentPlan) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, plan)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """``merge^2`` neighbouring patches -> one token of the LLM's width. The deepstack mergers
    normalise after concatenating the patches, the final merger before."""

    def __init__(self, cfg: VisionEncoderConfig, norm_after_concat: bool) -> None:
        super().__init__()
        self.merged = cfg.hidden_size * cfg.spatial_merge_size**2
        self.norm_after_concat = norm_after_concat
        self.ln_q = nn.LayerNorm(self.merged if norm_after_concat else cfg.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged, self.merged), nn.GELU(), nn.Linear(self.merged, cfg.out_hidden_size)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_after_concat:
            return self.mlp(self.ln_q(x.reshape(-1, self.merged)))
        return self.mlp(self.ln_q(x).reshape(-1, self.merged))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.side = int(cfg.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, norm_after_concat=False)
        self.merger_list = nn.ModuleList(
            PatchMerger(cfg, norm_after_concat=True) for _ in cfg.deepstack_visual_indexes
        )
        head_dim = cfg.hidden_size // cfg.num_heads
        quarter = head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _positions(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Interpolated learned position embeddings, and rotary cos/sin, per patch."""
        rows, cols, heights, widths = _patch_coordinates(grid_thw, self.cfg.spatial_merge_size)
        row_taps, row_w = _bilinear_taps(rows, heights, self.side)
        col_taps, col_w = _bilinear_taps(cols, widths, self.side)
        index = (row_taps[:, :, None] * self.side + col_taps[:, None, :]).reshape(-1, 4)
        weight = (row_w[:, :, None] * col_w[:, None, :]).reshape(-1, 4)
        pos = (self.pos_embed(index) * weight[..., None].to(self.pos_embed.weight.dtype)).sum(1)
        angles = torch.cat([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], dim=-1)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]  # (patches, 1 head, head_dim)
        return pos, angles.cos(), angles.sin()

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionOutput:
        grid_thw = grid_thw.to(device=pixel_values.device, dtype=torch.long)
        x = self.patch_embed(pixel_values)
        pos, cos, sin = self._positions(grid_thw)
        x = x + pos.to(x.dtype)
        frames = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])
        plan = SegmentPlan.from_lengths(frames)
        deepstack: list[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, plan)
            if index in self.cfg.deepstack_visual_indexes:
                deepstack.append(self.merger_list[self.cfg.deepstack_visual_indexes.index(index)](x))
        return VisionOutput(self.merger(x), deepstack)

    def encode_requests(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[VisionOutput]:
        """Several requests' ``(pixel_values, grid_thw)`` (images or videos) as one batch -> per
        request its merged tokens and deepstack features, its items one after the other."""
        device = self.pos_embed.weight.device
        out = self.forward(
            torch.cat([p.to(device) for p, _ in requests]), torch.cat([g.to(device) for _, g in requests])
        )
        sizes = [int(vision_token_counts(g, self.cfg.spatial_merge_size).sum()) for _, g in requests]
        embeds = out.embeds.split(sizes)
        deepstack = [d.split(sizes) for d in out.deepstack]
        return [VisionOutput(embeds[i], [d[i] for d in deepstack]) for i in range(len(requests))]
