"""The engine process's sender: one ``Events`` message per engine step, a lone output
never held for long, other reports at once and in order."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from mstar.engine.request import RequestOutput
from mstar.server.messages import Event, Events, Fatal, Stats, report_decoder
from mstar.server.report_sender import ReportSender
from mstar.server.tensor_codec import TensorCodec


class FakeSocket:
    def __init__(self) -> None:
        self.reports: list = []
        self.arrived = threading.Event()

    def send(self, raw: bytes) -> None:
        self.reports.append(report_decoder.decode(raw))
        self.arrived.set()


def start(sender: ReportSender) -> tuple[FakeSocket, threading.Thread]:
    sock = FakeSocket()
    thread = threading.Thread(target=sender.run, args=(sock,), daemon=True)
    thread.start()
    return sock, thread


def stop(sender: ReportSender, thread: threading.Thread) -> None:
    sender.stop()
    thread.join(5)
    assert not thread.is_alive()


def token(rid: str, value: int) -> RequestOutput:
    return RequestOutput(rid, signal="token", data=torch.tensor([value]))


def test_one_message_per_step_and_unwanted_signals_dropped():
    sender = ReportSender("0", TensorCodec("mstar_sendertest_"), max_hold_s=5.0)
    a, b = sender.sink(frozenset({"token"})), sender.sink(None)
    for step in range(2):  # queued before the thread runs: only the markers split them
        a.put(token("a", step))
        a.put(RequestOutput("a", signal="audio", data=torch.ones(2)))  # not asked for
        b.put(token("b", step))
        sender.step_ended()
    a.put(RequestOutput("a", signal="audio", data=torch.ones(2)))
    sender.step_ended()  # nothing of this step was queued: no message
    sock, thread = start(sender)
    stop(sender, thread)
    assert [type(r) for r in sock.reports] == [Events, Events]
    for step, report in enumerate(sock.reports):
        assert [(e.request_id, e.signal) for e in report.events] == [("a", "token"), ("b", "token")]
        assert report.events[0].value is not None and sender.codec.decode(report.events[0].value).tolist() == [step]


def test_a_lone_output_is_not_held_for_its_marker():
    sender = ReportSender("0", TensorCodec("mstar_sendertest_"), max_hold_s=0.01)
    sock, thread = start(sender)
    t0 = time.monotonic()
    sender.sink(None).put(token("a", 1))  # no step end follows
    assert sock.arrived.wait(5)
    assert time.monotonic() - t0 < 1.0
    assert sock.reports[0].events[0].request_id == "a"
    stop(sender, thread)


def test_reports_flush_what_came_before_them_in_order():
    sender = ReportSender("0", TensorCodec("mstar_sendertest_"), max_hold_s=5.0)
    sink = sender.sink(None)
    sink.put(token("a", 1))
    sender.put(Event("b", finished=True, finish_reason="error", error="refused", error_type="invalid_request"))
    sink.put(token("a", 2))
    sender.put(Fatal("0", "boom"))
    sink.put(RequestOutput("a", finished=True, finish_reason="stop"))
    sock, thread = start(sender)
    stop(sender, thread)  # the last, unmarked output still leaves at stop
    kinds = [(type(r).__name__, [e.request_id for e in r.events] if isinstance(r, Events) else None) for r in sock.reports]
    assert kinds == [("Events", ["a", "b"]), ("Events", ["a"]), ("Fatal", None), ("Events", ["a"])]


def test_real_engine_sends_one_message_per_step(tmp_path: Path):
    from mstar import Engine
    from mstar_toy.checkpoint import write_checkpoint

    sender = ReportSender("0", TensorCodec("mstar_sendertest_"), max_hold_s=5.0)  # markers only
    sock, thread = start(sender)
    with Engine.from_model("toy", weights=write_checkpoint(tmp_path)) as engine:
        engine.add_step_listener(sender.step_ended)
        sampling = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
        with engine._lock:  # all four start in the same step, whatever the thread timing
            for i in range(4):
                engine.add_request({"prompt_ids": torch.tensor([256, 65 + i])}, sampling, request_id=f"r{i}", _sink=sender.sink(frozenset({"token"})))
        deadline = time.monotonic() + 60
        finished: set[str] = set()
        while len(finished) < 4 and time.monotonic() < deadline:
            finished = {e.request_id for r in list(sock.reports) if isinstance(r, Events) for e in r.events if e.finished}
            time.sleep(0.01)
        steps = engine.stats()["steps"]
    stop(sender, thread)
    events = [r for r in sock.reports if isinstance(r, Events)]
    assert len(finished) == 4
    assert len(events) <= steps
    assert max(len(r.events) for r in events) >= 4  # a shared decode step: every request in one message
    tokens = [e for r in events for e in r.events if e.signal == "token"]
    assert len(tokens) == 4 * 12


def test_stats_reports_pass_through():
    from mstar.server.messages import EngineStats

    sender = ReportSender("0", TensorCodec("mstar_sendertest_"))
    sock, thread = start(sender)
    sender.put(Stats("0", EngineStats(0, 0, 0, [])))
    assert sock.arrived.wait(5)
    stop(sender, thread)
    assert isinstance(sock.reports[0], Stats)


def test_a_step_larger_than_the_socket_cap_leaves_in_several_messages():
    # The API's report socket refuses frames over its cap (issue 33): a big step is split.
    sender = ReportSender("0", TensorCodec("mstar_sendertest_", threshold=1 << 20), max_hold_s=5.0, max_message_bytes=3000)
    sink = sender.sink(None)
    for i in range(8):
        sink.put(RequestOutput(f"r{i}", signal="audio", data=torch.ones(250)))  # ~1 KB each, inline
    sender.step_ended()
    sock, thread = start(sender)
    stop(sender, thread)
    assert len(sock.reports) > 1 and all(isinstance(r, Events) for r in sock.reports)
    assert [e.request_id for r in sock.reports for e in r.events] == [f"r{i}" for i in range(8)]
