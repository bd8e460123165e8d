from __future__ import annotations

import asyncio

import pytest
import torch
from mstar.api.errors import ApiError
from mstar.server.messages import AbortRequest, AddRequest, CloseStream, Event, PushStream
from mstar.server.router import Finished, Router
from mstar.server.tensor_codec import SHM_DIR, TensorCodec


class FakeEngine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list = []
        self.down_reason: str | None = None

    @property
    def alive(self) -> bool:
        return self.down_reason is None

    serving = alive

    def unavailable_reason(self) -> str:
        return self.down_reason or "is starting"

    def send(self, cmd) -> None:
        self.sent.append(cmd)


@pytest.fixture
def setup():
    engines = {"a": FakeEngine("a"), "b": FakeEngine("b")}
    codec = TensorCodec("mstar_routertest_", threshold=1 << 20)
    return Router(engines, {"codes": "b"}, codec), engines, codec


def drain(stream) -> list:
    async def run():
        items = []
        while True:
            batch = await stream.next_batch()
            items += batch
            if isinstance(batch[-1], Finished):
                return items

    return asyncio.run(run())


def test_request_goes_to_every_engine_and_streams_are_forwarded(setup):
    router, engines, codec = setup
    stream = router.submit("r", {"ids": torch.tensor([1, 2])}, {}, {}, ["token"])
    assert all(isinstance(e.sent[0], AddRequest) and e.sent[0].signals == ["token"] for e in engines.values())
    item = torch.tensor([[3, 4]])
    router.on_events("a", [
        Event("r", "token", codec.encode(torch.tensor([7]))),
        Event("r", "codes", codec.encode(item), stream_item=True),
        Event("r", "codes", stream_closed=True),
        Event("r", finished=True, finish_reason="length"),
    ])
    push, close = engines["b"].sent[1:]
    assert isinstance(push, PushStream) and torch.equal(codec.decode(push.value), item)
    assert isinstance(close, CloseStream) and close.signal == "codes"
    router.on_events("b", [Event("r", "audio", codec.encode(torch.ones(3))), Event("r", finished=True, finish_reason="stop")])
    items = drain(stream)
    assert [s for s, _ in items[:-1]] == ["token", "audio"]
    assert items[-1] == Finished("length")  # the telling reason beats "stop"
    assert "r" not in router.streams


def test_an_error_in_one_engine_fails_the_request_and_aborts_the_others(setup):
    router, engines, _ = setup
    stream = router.submit("r", {}, {}, {}, None)
    router.on_events("b", [Event("r", finished=True, finish_reason="error", error="boom")])
    assert drain(stream)[-1] == Finished("error", "the engine failed while running this request: boom", 500, "engine_error")
    assert isinstance(engines["a"].sent[-1], AbortRequest)


@pytest.mark.parametrize(
    ("error_type", "status", "code"),
    [("invalid_request", 400, "invalid_value"), ("too_large", 400, "context_length_exceeded"), ("internal", 500, "engine_error"), (None, 500, "engine_error")],
)
def test_engine_error_types_map_to_http(setup, error_type, status, code):
    router, _, _ = setup
    stream = router.submit("r", {}, {}, {}, None)
    router.on_events("a", [Event("r", finished=True, finish_reason="error", error="ValueError: the prompt is empty", error_type=error_type)])
    fin = drain(stream)[-1]
    assert (fin.status, fin.code) == (status, code)
    # No error body names a Python exception; a server fault says it is one.
    assert fin.error == ("the prompt is empty" if status == 400 else "the engine failed while running this request: the prompt is empty")


def test_engine_down_fails_its_requests_and_refuses_new_ones(setup):
    router, engines, _ = setup
    stream = router.submit("r", {}, {}, {}, None)
    engines["a"].down_reason = "was killed by signal 9"
    router.engine_down("a", "was killed by signal 9")
    fin = drain(stream)[-1]
    assert fin.reason == "error" and fin.status == 503 and "signal 9" in fin.error
    assert isinstance(engines["b"].sent[-1], AbortRequest)
    with pytest.raises(ApiError) as err:
        router.submit("r2", {}, {}, {}, None)
    assert err.value.status == 503


def test_abort_and_late_events_are_ignored(setup):
    router, engines, codec = setup
    router.submit("r", {}, {}, {}, None)
    router.abort("r")
    assert all(isinstance(e.sent[-1], AbortRequest) for e in engines.values())
    router.on_events("a", [Event("r", "token", codec.encode(torch.tensor([1]))), Event("r", finished=True)])
    assert router.streams == {}


@pytest.mark.parametrize(
    ("sampling", "kwargs", "param"),
    [
        ({"lm": {"main": {"seed": 2**64}}}, {}, "seed"),
        ({"lm": {"main": {"max_tokens": -(2**63) - 1}}}, {}, "max_tokens"),
        ({"lm": {"main": {}, "aux": {"residual": {"seed": 2**70}}}}, {}, "sampling.aux.residual.seed"),
        ({}, {"speakers": [1, 2**65]}, "kwargs.speakers.1"),
    ],
)
def test_integers_beyond_64_bits_are_a_400_and_register_nothing(setup, sampling, kwargs, param):
    router, engines, _ = setup
    with pytest.raises(ApiError) as err:
        router.submit("r", {}, sampling, kwargs, None)
    assert err.value.status == 400 and err.value.param == param
    assert router.streams == {} and all(e.sent == [] for e in engines.values())


def test_64_bit_integers_still_pass(setup):
    router, engines, _ = setup
    router.submit("r", {}, {"lm": {"main": {"seed": 2**64 - 1}}}, {"x": -(2**63)}, None)
    assert all(isinstance(e.sent[0], AddRequest) for e in engines.values())


def test_output_beyond_the_buffer_limit_aborts_and_drops_it():
    engines = {"a": FakeEngine("a")}
    codec = TensorCodec("mstar_routertest_", threshold=1 << 20)
    router = Router(engines, {}, codec, max_buffer_bytes=100)
    stream = router.submit("r", {}, {}, {}, None)
    router.on_events("a", [Event("r", "audio", codec.encode(torch.ones(20)))])  # 80 bytes: kept
    assert stream.buffered == 80 and not stream.done
    taken = asyncio.run(stream.next_batch())
    assert len(taken) == 1 and stream.buffered == 0  # read: the budget is free again
    router.on_events("a", [Event("r", "audio", codec.encode(torch.ones(20))), Event("r", "audio", codec.encode(torch.ones(20)))])
    (fin,) = drain(stream)  # the queued audio is dropped, only the error is left
    assert fin.reason == "error" and fin.status == 408 and fin.code == "output_buffer_full"
    assert isinstance(engines["a"].sent[-1], AbortRequest) and "r" not in router.streams


def test_a_request_is_sent_only_to_the_engines_it_needs():
    engines = {"a": FakeEngine("a"), "b": FakeEngine("b")}
    router = Router(engines, {}, TensorCodec("mstar_routertest_", threshold=1 << 20),
                    engines_for=lambda kwargs: {"a"} if kwargs.get("text_only") else {"a", "b"})
    engines["b"].down_reason = "is restarting"  # a request that does not need b still runs
    stream = router.submit("r", {"ids": torch.tensor([1])}, {}, {"text_only": True}, None)
    assert [type(m) for m in engines["a"].sent] == [AddRequest] and engines["b"].sent == []
    router.on_events("a", [Event("r", finished=True, finish_reason="stop")])
    assert drain(stream)[-1].reason == "stop"
    with pytest.raises(ApiError):
        router.submit("r2", {"ids": torch.tensor([1])}, {}, {}, None)


def test_kwargs_the_walk_choice_rejects_are_a_400():
    """engines_for runs the model's state machine on the kwargs; its ValueError (e.g. an
    unknown voice) answers the caller with a 400, not a server error."""
    def engines_for(kwargs):
        if kwargs.get("voice") == "nobody":
            raise ValueError("unknown voice 'nobody'; this checkpoint has ['ethan']")
        return {"a"}

    engines = {"a": FakeEngine("a")}
    router = Router(engines, {}, TensorCodec("mstar_routertest_", threshold=1 << 20), engines_for=engines_for)
    with pytest.raises(ApiError) as err:
        router.submit("r", {"ids": torch.tensor([1])}, {}, {"voice": "nobody"}, None)
    assert err.value.status == 400 and "ethan" in str(err.value) and engines["a"].sent == [] and "r" not in router.streams


def test_a_stream_item_crosses_the_api_process_as_it_came(setup, monkeypatch):
    """A large item (through shared memory) goes to the consuming engine in the engine's own
    message: the same segment, not decoded and encoded again here; if that engine cannot take
    it, the segment is freed."""
    router, engines, _ = setup
    sender = TensorCodec("mstar_routertest_", threshold=16)  # the producing engine's codec
    router.submit("r", {}, {}, {}, None)
    decoded = []
    monkeypatch.setattr(router.codec, "decode", lambda msg: decoded.append(msg) or TensorCodec.decode(msg))
    item = torch.arange(64.0).reshape(8, 8)
    msg = sender.encode(item)
    assert msg.shm is not None
    router.on_events("a", [Event("r", "codes", msg, stream_item=True)])
    push = engines["b"].sent[-1]
    assert isinstance(push, PushStream) and push.value is msg and not decoded
    assert torch.equal(TensorCodec.decode(push.value), item)  # the consumer's side: its bytes, then freed
    engines["b"].down_reason = "crashed"
    lost = sender.encode(item)
    router.on_events("a", [Event("r", "codes", lost, stream_item=True)])
    assert lost.shm is None and not any(SHM_DIR.glob("mstar_routertest_*"))
