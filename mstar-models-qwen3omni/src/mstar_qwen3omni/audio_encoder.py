"""The Thinker's audio encoder (AuT): log-mel features -> three stride-2 convolutions per chunk of
``2 * n_window`` frames -> a Transformer whose attention is windowed by ``n_window_infer`` -> the
output projection into the LLM's width. Sizes come from ``thinker_config.audio_config``; parameter
names equal the checkpoint's ``thinker.audio_tower.*`` keys.

Interface (stateless, batched over any number of audios of different lengths; no per-chunk Python):

    cfg = AudioEncoderConfig.from_dict(config_json["thinker_config"]["audio_config"])
    enc = AudioEncoder(cfg)                          # then mstar.weights.load_weights(enc, ckpt, **AUDIO_TOWER_KEYS)
    feats, lens = pack_features(input_features, feature_attention_mask)   # processor tensors
    tokens = enc(feats, lens, pad_groups=None)       # (sum(audio_output_lengths(lens)), output_dim)
    per_audio = tokens.split(audio_output_lengths(lens, cfg.n_window).tolist())
    per_request = enc.encode_requests([(input_features, feature_attention_mask), ...])

``pad_groups`` (one id per audio) says which audios transformers would encode in one call (the
audios of one request): transformers pads every chunk of a call to that call's longest chunk, and
because each convolution's bias reaches into the padding, a short audio's last frames depend on
that width. Audios with the same id get the same width as in transformers; by default each audio
is its own group, so an audio's output never depends on what else is in the batch.

Token counts follow the convolutions' arithmetic; transformers' processor hard-codes 13 tokens
per full chunk, which is the same number for the released ``n_window = 50``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from .media_activation import activation
from .media_attention import SegmentPlan, segment_attention


@dataclass(frozen=True)
class AudioEncoderConfig:
    """``thinker_config.audio_config``; defaults are transformers' for this model."""

    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    activation_function: str = "gelu"
    max_source_positions: int = 1500
    n_window: int = 50
    n_window_infer: int = 800
    output_dim: int = 3584
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480

    @classmethod
    def from_dict(cls, d: dict) -> AudioEncoderConfig:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _conv_len(n: torch.Tensor) -> torch.Tensor:
    """Output length of a kernel-3, stride-2, padding-1 convolution (0 stays 0)."""
    return torch.div(n - 1, 2, rounding_mode="floor") + 1


def _conv3_len(n: torch.Tensor) -> torch.Tensor:
    return _conv_len(_conv_len(_conv_len(n)))


def audio_output_lengths(feature_lens: torch.Tensor, n_window: int) -> torch.Tensor:
    """Audio tokens per audio of ``feature_lens`` mel frames (what the processor counts)."""
    chunk = 2 * n_window
    full = _conv3_len(torch.tensor(chunk))
    return torch.div(feature_lens, chunk, rounding_mode="floor") * full + _conv3_len(feature_lens % chunk)


def pack_features(input_features: torch.Tensor, feature_attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Processor output ``(batch, mel, frames)`` + mask -> ``(mel, total_frames)`` and frames per audio."""
    mask = feature_attention_mask.bool()
    feats = input_features.permute(0, 2, 1)[mask].permute(1, 0)
    return feats, mask.sum(-1)


def _split_lengths(totals: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each total into pieces of ``size`` (the last one shorter); returns each piece's length,
    owner (index into ``totals``) and position among its owner's pieces."""
    pieces = torch.div(totals + size - 1, size, rounding_mode="floor")
    owner = torch.repeat_interleave(torch.arange(totals.numel(), device=totals.device), pieces)
    first = torch.cumsum(pieces, 0) - pieces
    index = torch.arange(owner.numel(), device=totals.device) - first[owner]
    lengths = torch.clamp(totals[owner] - index * size, max=size)
    return lengths, owner, index


def _sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-step * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioAttention(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.encoder_attention_heads
        self.scale = (d // self.heads) ** -0.5
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, plan: SegmentPlan) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (p(x).view(n, self.heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(segment_attention(q, k, v, plan, self.scale).reshape(n, -1))


class AudioEncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = AudioAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.act = activation(cfg.activation_function)

    def forward(self, x: torch.Tensor, plan: SegmentPlan) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), plan)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hidden = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        freq = _conv3_len(torch.tensor(cfg.num_mel_bins)).item()
        self.conv_out = nn.Linear(hidden * freq, cfg.d_model, bias=False)
        self.register_buffer(
            "positional_embedding", _sinusoids(cfg.max_source_positions, cfg.d_model), persistent=False
        )
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        self.act = activation(cfg.activation_function)

    def _downsample(self, chunks: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """(chunks, 1, mel, frames) -> (chunks, time, d_model); ``widths`` is each chunk's padded
        width in transformers' call, beyond which every layer's input must read as zero padding."""
        x = chunks
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = F.gelu(conv(x))
            widths = _conv_len(widths)
            x = x * (torch.arange(x.shape[-1], device=x.device) < widths[:, None])[:, None, None, :].to(x.dtype)
        b, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * f))
        return x + self.positional_embedding[:t].to(x.dtype)

    def forward(
        self, features: torch.Tensor, feature_lens: torch.Tensor, pad_groups: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``features`` (num_mel_bins, total_frames): the audios' mel frames one after the other;
        ``feature_lens`` (audios,) frames per audio. Returns (total_tokens, output_dim)."""
        device = features.device
        lens = feature_lens.to(device=device, dtype=torch.long)
        if lens.numel() == 0:
            return features.new_zeros(0, self.cfg.output_dim)
        if int(lens.min()) <= 0:
            raise ValueError("every audio needs at least one mel frame")
        size = 2 * self.cfg.n_window
        chunk_lens, owner, index = _split_lengths(lens, size)
        # Padded width per audio: its group's longest chunk, as in one transformers call.
        longest = torch.clamp(lens, max=size)
        if pad_groups is not None:
            groups = pad_groups.to(device=device, dtype=torch.long)
            group_max = torch.zeros(int(groups.max()) + 1, dtype=torch.long, device=device)
            group_max = group_max.scatter_reduce(0, groups, longest, reduce="amax")
            longest = group_max[groups]
        widths = longest[owner]
        width = int(widths.max())

        starts = (torch.cumsum(lens, 0) - lens)[owner] + index * size
        offsets = torch.arange(width, device=device)
        frames = features.T[torch.clamp(starts[:, None] + offsets, max=features.shape[1] - 1)]
        weight_dtype = self.conv2d1.weight.dtype
        frames = frames.to(weight_dtype) * (offsets < chunk_lens[:, None])[..., None].to(weight_dtype)
        chunks = frames.transpose(1, 2).unsqueeze(1)  # (chunks, 1, mel, width)

        step = max(1, self.cfg.conv_chunksize)
        embedded = torch.cat(
            [self._downsample(chunks[i : i + step], widths[i : i + step]) for i in range(0, chunks.shape[0], step)]
        )
        valid = torch.arange(embedded.shape[1], device=device) < _conv3_len(chunk_lens)[:, None]
        x = embedded[valid]

        tokens_per_audio = audio_output_lengths(lens, self.cfg.n_window)
        window = int(_conv3_len(torch.tensor(size))) * (self.cfg.n_window_infer // size)
        plan = SegmentPlan.from_lengths(_split_lengths(tokens_per_audio, window)[0])
        for layer in self.layers:
            x = layer(x, plan)
        return self.proj2(self.act(self.proj1(self.ln_post(x))))

    def encode_requests(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Several requests' processor tensors, ``(input_features (audios, mel, frames),
        feature_attention_mask (audios, frames))`` each, as one batch -> per request its audio
        tokens ``(tokens, output_dim)``, its audios one after the other. A request's audios are
        padded together, as transformers pads the audios of one request."""
        packed = [pack_features(f, m) for f, m in requests]
        device = self.conv2d1.weight.device
        feats = torch.cat([f.to(device) for f, _ in packed], dim=1)
        lens = torch.cat([n for _, n in packed]).to(device)
        groups = torch.repeat_interleave(torch.arange(len(packed)), torch.tensor([n.numel() for _, n in packed]))
        out = self.forward(feats, lens, groups.to(device))
        per_request = [int(audio_output_lengths(n, self.cfg.n_window).sum()) for _, n in packed]
        return list(out.split(per_request))

    def encode(self, mels: list[torch.Tensor], pad_groups: list[int] | None = None) -> list[torch.Tensor]:
        """Convenience: a list of (num_mel_bins, frames) tensors -> a list of (tokens, output_dim)."""
        lens = torch.tensor([m.shape[-1] for m in mels], dtype=torch.long)
        groups = None if pad_groups is None else torch.tensor(pad_groups, dtype=torch.long)
        out = self.forward(torch.cat(mels, dim=-1), lens, groups)
        return list(out.split(audio_output_lengths(lens, self.cfg.n_window).tolist()))
