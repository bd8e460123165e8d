"""mstar.layers.streaming: every stateful layer, fed a stream chunk by chunk with its
carried state, gives what it gives the whole sequence; several streams at different
offsets share one call through stack/split; the carried state does not grow."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mstar.layers.streaming import (
    CausalConv1d,
    CausalConvTranspose1d,
    StreamState,
    stream_positions,
    window_keys_values,
)
from torch import nn

CHUNKINGS = [[1] * 40, [4, 12, 12, 12], [7, 1, 3, 29], [40]]


def _chunks(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(x.split(sizes, dim=-1))


class WindowAttention(nn.Module):
    """A minimal sliding-window attention over [B, T, C]: whole (mask) or streamed."""

    def __init__(self, dim: int, window: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.window = window

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        q, k, v = (t[:, None] for t in self.qkv(x).chunk(3, dim=-1))  # one head
        if state is None:
            pos = torch.arange(x.shape[1])
            delta = pos[:, None] - pos[None, :]
            mask = (delta >= 0) & (delta < self.window)
        else:
            positions = stream_positions(state, self, x.shape[1], x.device)
            k, v, mask = window_keys_values(state, self, k, v, positions, self.window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[:, 0]


class TinyCodec(nn.Module):
    """conv → window attention → upsampling transposed convs → dilated conv, on [B, C, T]."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = CausalConv1d(4, 8, 3)
        self.attn = WindowAttention(8, window=5)
        self.up1 = CausalConvTranspose1d(8, 6, 4, 2)
        self.up2 = CausalConvTranspose1d(6, 3, 9, 3)
        self.post = CausalConv1d(3, 2, 7, dilation=3, groups=1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        h = self.pre(x, state)
        h = h + self.attn(h.transpose(1, 2), state).transpose(1, 2)
        return self.post(self.up2(self.up1(h, state), state), state)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 4, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _stream(layer: nn.Module, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    state = StreamState(batch=x.shape[0])
    return torch.cat([layer(c, state) for c in _chunks(x, sizes)], dim=-1)


@pytest.mark.parametrize("sizes", CHUNKINGS)
@pytest.mark.parametrize("kernel,dilation,groups", [(3, 1, 1), (7, 3, 4), (1, 1, 1)])
def test_causal_conv_streams_like_the_whole(x, sizes, kernel, dilation, groups) -> None:
    conv = CausalConv1d(4, 4, kernel, dilation, groups).double()
    torch.testing.assert_close(_stream(conv, x, sizes), conv(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("sizes", CHUNKINGS)
@pytest.mark.parametrize("kernel,stride,trim_left", [(4, 2, 0), (10, 5, 0), (9, 3, 0), (3, 3, 0), (4, 2, 2), (10, 5, 5)])
def test_transposed_conv_streams_like_the_whole(x, sizes, kernel, stride, trim_left) -> None:
    up = CausalConvTranspose1d(4, 3, kernel, stride, trim_left).double()
    nn.init.normal_(up.conv.bias)  # a bias added twice on the overlap would show
    whole = up(x)
    assert whole.shape[-1] == 40 * stride - trim_left
    if trim_left:  # as transformers' Qwen3-Omni Code2Wav: kernel - stride cut on both sides
        torch.testing.assert_close(whole, up.conv(x)[..., trim_left : -(kernel - stride)], atol=0, rtol=0)
    torch.testing.assert_close(_stream(up, x, sizes), whole, atol=1e-12, rtol=0)


def test_left_trimmed_streams_share_calls_only_at_the_same_stage(x) -> None:
    up = CausalConvTranspose1d(4, 3, 4, 2, trim_left=2).double()
    fresh, started = StreamState(), StreamState()
    up(x[:1, :, :3], started)
    together = StreamState.stack([StreamState(), StreamState()])
    assert up(x[:, :, :3], together).shape[-1] == 3 * 2 - 2  # both first chunks: trimmed
    with pytest.raises(ValueError, match="cannot share a call"):
        up(x[:, :, 3:6], StreamState.stack([fresh, started]))


@pytest.mark.parametrize("sizes", CHUNKINGS)
@pytest.mark.parametrize("window", [1, 2, 5, 50])
def test_window_attention_streams_like_the_whole(x, sizes, window) -> None:
    attn = WindowAttention(4, window).double()
    seq = x.transpose(1, 2)  # [B, T, C]
    state = StreamState(batch=2)
    streamed = torch.cat([attn(c, state) for c in seq.split(sizes, dim=1)], dim=1)
    torch.testing.assert_close(streamed, attn(seq), atol=1e-12, rtol=0)


@pytest.mark.parametrize("sizes", CHUNKINGS)
def test_a_composite_decoder_streams_like_the_whole(x, sizes) -> None:
    codec = TinyCodec().double()
    whole = codec(x)
    assert whole.shape[-1] == 40 * 6
    torch.testing.assert_close(_stream(codec, x, sizes), whole, atol=1e-12, rtol=0)


def test_streams_at_different_offsets_share_a_call() -> None:
    """A fresh stream and two advanced ones, stacked into one call, each give what they
    give alone; split returns states that continue as if they had run alone."""
    codec = TinyCodec().double()
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 4, 30, generator=gen, dtype=torch.float64) for _ in range(3)]
    alone = [codec(x) for x in xs]
    states = [StreamState(), StreamState(), StreamState()]
    outs: list[list[torch.Tensor]] = [[], [], []]
    for i, done in ((1, 9), (2, 17)):  # streams 1 and 2 start ahead; stream 0 is fresh
        outs[i].append(codec(xs[i][..., :done], states[i]))
    offsets = [0, 9, 17]
    stacked = StreamState.stack(states)
    assert stacked.batch == 3
    y = codec(torch.cat([x[..., o : o + 5] for x, o in zip(xs, offsets, strict=True)]), stacked)
    states = stacked.split([1, 1, 1])
    for i in range(3):
        outs[i].append(y[i : i + 1])
        outs[i].append(codec(xs[i][..., offsets[i] + 5 :], states[i]))
        torch.testing.assert_close(torch.cat(outs[i], dim=-1), alone[i], atol=1e-12, rtol=0)


def test_carried_state_does_not_grow() -> None:
    codec = TinyCodec()
    state = StreamState()
    x = torch.randn(1, 4, 12 * 40, generator=torch.Generator().manual_seed(2))
    sizes = []
    for i, c in enumerate(x.split(12, dim=-1)):
        codec(c, state)
        sizes.append(state.nbytes)
        if i == 2:
            early = {layer: [t.shape for t in ts] for layer, ts in state.entries.items()}
    assert len(set(sizes)) == 1 and sizes[0] > 0
    assert {layer: [t.shape for t in ts] for layer, ts in state.entries.items()} == early


def test_mismatched_batch_is_an_error() -> None:
    state = StreamState(batch=2)
    with pytest.raises(ValueError, match="batch 2"):
        CausalConv1d(4, 4, 3)(torch.randn(1, 4, 5), state)
    with pytest.raises(ValueError, match="split"):
        state.split([1])
