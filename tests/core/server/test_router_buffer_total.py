"""The server-wide cap on output waiting for clients (``--max-stream-buffer-total-bytes``):
over it, the request with the most output waiting is aborted, its queue dropped, whichever
request's output pushed the total over; reading and closing give bytes back."""

from __future__ import annotations

import asyncio

import torch
from mstar.server.messages import AbortRequest, Event
from mstar.server.router import Finished, Router
from mstar.server.tensor_codec import TensorCodec


class FakeEngine:
    name = "a"
    alive = serving = True

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, cmd) -> None:
        self.sent.append(cmd)


def _setup(total: int) -> tuple[Router, FakeEngine, TensorCodec]:
    engine = FakeEngine()
    codec = TensorCodec("mstar_routertotal_", threshold=1 << 20)
    return Router({"a": engine}, {}, codec, max_buffer_bytes=1000, max_total_buffer_bytes=total), engine, codec


def _out(codec: TensorCodec, rid: str, floats: int) -> Event:
    return Event(rid, "audio", codec.encode(torch.ones(floats)))


def test_over_the_total_the_slowest_reader_is_aborted_not_the_one_whose_output_came_last():
    router, engine, codec = _setup(total=200)
    slow, other, last = (router.submit(r, {}, {}, {}, None) for r in ("slow", "other", "last"))
    router.on_events("a", [_out(codec, "slow", 30), _out(codec, "other", 10)])  # 120 + 40 bytes: under both caps
    assert router.buffered.bytes == 160 and not slow.done
    router.on_events("a", [_out(codec, "last", 20)])  # 80 more: 240 > 200
    assert slow.done and not other.done and not last.done
    (fin,) = asyncio.run(slow.next_batch())
    assert isinstance(fin, Finished) and fin.status == 408 and fin.code == "output_buffer_full"
    assert "most" in (fin.error or "")
    assert router.buffered.bytes == 120 and "slow" not in router.streams
    assert [m.request_id for m in engine.sent if isinstance(m, AbortRequest)] == ["slow"]


def test_reading_and_closing_give_bytes_back_to_the_total():
    router, _, codec = _setup(total=10_000)
    a, b = router.submit("a", {}, {}, {}, None), router.submit("b", {}, {}, {}, None)
    router.on_events("a", [_out(codec, "a", 50), _out(codec, "b", 25)])
    assert router.buffered.bytes == 300
    asyncio.run(a.next_batch())
    assert router.buffered.bytes == 100
    router.on_events("a", [Event("b", finished=True, finish_reason="stop")])  # ended, its output still unread
    assert router.buffered.bytes == 100
    b.release()  # the response closed without reading it
    assert router.buffered.bytes == 0
    items = asyncio.run(b.next_batch())
    assert len(items) == 1 and isinstance(items[0], Finished)  # the end stays queued
