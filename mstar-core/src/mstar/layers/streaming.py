"""Stateful streaming for causal decoders (audio codecs): each layer carries what it needs
of the past from one chunk to the next, so a chunk costs the same at second 5 and at
minute 5, and the concatenated chunks equal one whole decode (up to float rounding).

What a layer carries:

- ``CausalConv1d`` (stride 1, left-padded): its last ``(kernel - 1) * dilation`` inputs.
  A fresh stream carries zeros, which is exactly the whole decode's zero padding.
- ``CausalConvTranspose1d`` (output trimmed by ``kernel - stride`` on the right, so
  ``stride`` outputs per input, optionally less ``trim_left`` at the start): the
  overlap-add tail, i.e. the ``kernel - stride`` outputs the chunk's last inputs already
  touched but later inputs will still add to (and whether the stream has started).
- Sliding-window attention (``stream_positions`` + ``window_keys_values``): the keys and
  values of the last ``window - 1`` positions and the stream's position counter, so RoPE
  sees absolute positions and each query attends exactly the keys the whole decode gives it.

How a plugin uses it: build the decoder from these layers, pass one ``StreamState`` per
stream through ``forward`` (``None`` = whole-sequence decode, arithmetic unchanged), and keep
the state in the engine's ``PerRequestState`` (a stateless node receives it in
``engine_inputs.per_request_states``; the engine drops it when the request leaves). Feed
the node with chunks that carry no left context (``LeftContextChunks(chunk, 0, first)``).
Several streams share a call with ``StreamState.stack`` and ``split``; a fresh stream
stacks as zeros, which every layer here treats as "nothing before".

Not covered: strided causal convolutions. With ``trim_left``, streams at their first chunk
and streams past it need separate calls (their outputs differ in length).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


class StreamState:
    """The carried tensors of every stateful layer for ``batch`` streams (batch-first).

    Entries are keyed by the layer object itself (or a tuple naming one of its counters),
    so a state belongs to one decoder instance; a layer with no entry yet starts from zeros."""

    def __init__(self, batch: int = 1) -> None:
        self.batch = batch
        self.entries: dict[Hashable, tuple[torch.Tensor, ...]] = {}

    def get(self, layer: Hashable) -> tuple[torch.Tensor, ...] | None:
        return self.entries.get(layer)

    def put(self, layer: Hashable, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if t.shape[0] != self.batch:
                raise ValueError(f"stream state of batch {self.batch} got a tensor of batch {t.shape[0]}")
        # Contiguous copies: a slice would pin the whole chunk's activations in memory.
        self.entries[layer] = tuple(t.contiguous().clone() for t in tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.entries.values() for t in ts)

    @classmethod
    def stack(cls, states: Sequence[StreamState]) -> StreamState:
        """One state for the streams of ``states`` in order (to decode them in one call)."""
        out = cls(sum(s.batch for s in states))
        layers: dict[Hashable, tuple[torch.Tensor, ...]] = {}
        for s in states:
            for layer, ts in s.entries.items():
                layers.setdefault(layer, ts)
        for layer, template in layers.items():
            parts = []
            for s in states:
                ts = s.entries.get(layer)
                parts.append(ts if ts is not None else tuple(t.new_zeros((s.batch, *t.shape[1:])) for t in template))
            out.entries[layer] = tuple(torch.cat(column, dim=0) for column in zip(*parts, strict=True))
        return out

    def split(self, batches: Sequence[int]) -> list[StreamState]:
        """The inverse of ``stack``: states of ``batches`` streams each, in order."""
        if sum(batches) != self.batch:
            raise ValueError(f"cannot split a state of batch {self.batch} into {list(batches)}")
        outs = [StreamState(b) for b in batches]
        for layer, ts in self.entries.items():
            columns = [t.split(list(batches), dim=0) for t in ts]
            for i, out in enumerate(outs):
                out.entries[layer] = tuple(c[i].clone() for c in columns)
        return outs


class CausalConv1d(nn.Module):
    """Conv1d (stride 1) padded on the left so output t sees inputs <= t; ``.conv`` holds
    the checkpoint's weights."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        if state is None:
            return self.conv(F.pad(x, (self.left, 0)))
        carried = state.get(self)
        past = carried[0] if carried is not None else x.new_zeros(x.shape[0], x.shape[1], self.left)
        full = torch.cat([past, x], dim=-1)
        state.put(self, full[..., full.shape[-1] - self.left :])
        return self.conv(full)


class CausalConvTranspose1d(nn.Module):
    """Transposed conv whose right overhang (``kernel - stride``) is cut: ``stride`` outputs
    per input, less ``trim_left`` at the very start (for decoders that cut ``kernel - stride``
    on both sides); ``.conv`` holds the checkpoint's weights."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, trim_left: int = 0) -> None:
        super().__init__()
        if kernel < stride or trim_left < 0:
            raise ValueError(f"CausalConvTranspose1d needs kernel >= stride and trim_left >= 0, got {kernel}, {stride}, {trim_left}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.trim = kernel - stride
        self.trim_left = trim_left

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        y = self.conv(x)
        n = x.shape[-1] * self.stride  # outputs no later input can touch
        if state is None:
            return y[..., self.trim_left : n]
        if self.trim:
            carried = state.get(self)
            if carried is not None:
                y = torch.cat([y[..., : self.trim] + carried[0], y[..., self.trim :]], dim=-1)
            tail = y[..., n:]
            if self.conv.bias is not None:
                tail = tail - self.conv.bias[:, None]  # the next chunk's outputs add their own bias
            state.put(self, tail)
        return y[..., self._start(state) : n]

    def _start(self, state: StreamState) -> int:
        """``trim_left`` on a stream's first chunk, else 0."""
        if not self.trim_left:
            return 0
        key = (self, "started")
        started = state.get(key)
        first = started is None or not bool(started[0].any())
        if started is not None and bool(started[0].any()) != bool(started[0].all()):
            raise ValueError("streams at their start and streams past it cannot share a call (trim_left)")
        state.put(key, torch.ones(state.batch, dtype=torch.bool, device=self.conv.weight.device))
        return self.trim_left if first else 0


def stream_positions(state: StreamState, owner: nn.Module, length: int, device: torch.device) -> torch.Tensor:
    """[B, length] absolute positions of a chunk's frames, advancing ``owner``'s counter."""
    key = (owner, "positions")  # apart from any window the owner itself carries
    carried = state.get(key)
    start = carried[0] if carried is not None else torch.zeros(state.batch, dtype=torch.long, device=device)
    state.put(key, start + length)
    return start[:, None] + torch.arange(length, device=device)


def window_keys_values(
    state: StreamState, layer: nn.Module, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values a sliding-window layer attends in this chunk, and the mask.

    ``k``, ``v``: [B, H, T, D] of the chunk's frames (RoPE applied); ``positions``: [B, T].
    Returns keys/values [B, H, window - 1 + T, D] (carried, then new) and a bool mask
    [B, 1, T, window - 1 + T]: query p attends key q iff 0 <= p - q < window and q >= 0
    (carried slots before the stream's start hold zeros and stay masked)."""
    keep = window - 1
    carried = state.get(layer)
    if carried is None:
        b, h, _, d = k.shape
        carried = (k.new_zeros(b, h, keep, d), v.new_zeros(b, h, keep, d))
    keys = torch.cat([carried[0], k], dim=2)
    values = torch.cat([carried[1], v], dim=2)
    state.put(layer, keys[:, :, keys.shape[2] - keep :], values[:, :, values.shape[2] - keep :])
    key_pos = torch.cat([positions[:, :1] - keep + torch.arange(keep, device=positions.device), positions], dim=1)
    delta = positions[:, :, None] - key_pos[:, None, :]
    mask = (delta >= 0) & (delta < window) & (key_pos[:, None, :] >= 0)
    return keys, values, mask[:, None]
