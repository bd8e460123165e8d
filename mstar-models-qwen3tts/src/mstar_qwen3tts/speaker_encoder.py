"""The Base checkpoints' speaker encoder: an ECAPA-TDNN x-vector from log-mel features.

Reference audio (24 kHz, mono) → a 128-bin log-mel spectrogram (hop 256, window 1024,
Slaney mel filters up to 12 kHz) → TDNN + SE-Res2Net blocks → attentive statistics pooling
→ one vector of the talker's width, which the clone prompt puts where a CustomVoice prompt
has its speaker's codec embedding. Weights: ``speaker_encoder.*`` in ``model.safetensors``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

MEL = {"n_fft": 1024, "num_mels": 128, "hop": 256, "win": 1024, "fmin": 0.0, "fmax": 12000.0}


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeakerEncoderConfig:
        known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in cls.__dataclass_fields__}
        cfg = cls(**known)
        if not len(cfg.enc_channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations):
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        return cfg


def _slaney_hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    # Linear below 1 kHz, logarithmic above (the Slaney / Auditory Toolbox scale).
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    lin = hz / f_sp
    return torch.where(hz >= min_log_hz, min_log_mel + torch.log(hz.clamp(min=1e-10) / min_log_hz) / logstep, lin)


def _slaney_mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    return torch.where(mel >= min_log_mel, min_log_hz * torch.exp(logstep * (mel - min_log_mel)), f_sp * mel)


def mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters on the Slaney scale, area-normalized
    (what ``librosa.filters.mel`` gives by default), computed in float64."""
    fft_freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    lo, hi = _slaney_hz_to_mel(torch.tensor(fmin, dtype=torch.float64)), _slaney_hz_to_mel(torch.tensor(fmax, dtype=torch.float64))
    hz = _slaney_mel_to_hz(torch.linspace(float(lo), float(hi), n_mels + 2, dtype=torch.float64))
    widths = hz[1:] - hz[:-1]
    ramps = hz[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    return (weights * (2.0 / (hz[2:] - hz[:-2]))[:, None]).to(torch.float32)


def log_mel(wave: torch.Tensor, sample_rate: int) -> torch.Tensor:
    """[B, samples] float32 → [B, frames, 128] log-mel features (reflect-padded, uncentred STFT)."""
    n_fft, hop, win = MEL["n_fft"], MEL["hop"], MEL["win"]
    basis = mel_filters(sample_rate, int(n_fft), int(MEL["num_mels"]), MEL["fmin"], MEL["fmax"]).to(wave.device)
    pad = (int(n_fft) - int(hop)) // 2
    x = torch.nn.functional.pad(wave[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(x, int(n_fft), hop_length=int(hop), win_length=int(win), window=torch.hann_window(int(win), device=wave.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ mag, min=1e-5)).transpose(1, 2)


class TDNNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNNBlock(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        prev: torch.Tensor | None = None
        for i, part in enumerate(parts[1:]):
            prev = self.blocks[i](part if prev is None else part + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se_channels, 1)
        self.conv2 = nn.Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    """Attention over time (conditioned on the utterance's mean and std), then the
    attention-weighted mean and std, concatenated."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    @staticmethod
    def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean[:, :, None]).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        mean, std = self._stats(x, torch.full_like(x[:, :1], 1.0 / frames))
        context = torch.cat([x, mean[:, :, None].expand_as(x), std[:, :, None].expand_as(x)], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attn)
        return torch.cat([mean, std], dim=1)[:, :, None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(cfg.mel_dim, ch[0], ks[0], dil[0])]
        blocks += [SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
                   for i in range(1, len(ch) - 1)]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """[B, frames, mel_dim] → [B, enc_dim]."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[:, :, 0]

    @torch.inference_mode()
    def embed(self, wave: torch.Tensor) -> torch.Tensor:
        """[samples] float32 at ``cfg.sample_rate`` → the x-vector [enc_dim] (float32)."""
        device = self.fc.weight.device
        mels = log_mel(wave.to(device=device, dtype=torch.float32)[None], self.cfg.sample_rate)
        return self(mels.to(self.fc.weight.dtype))[0].float()
