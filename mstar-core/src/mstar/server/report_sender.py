"""The engine process's outgoing side: request sinks, and a sender thread that sends one
``Events`` message per engine step.

The engine thread hands each output to the request's sink, which queues it; after the
step's last output the engine calls its step listeners, and ours queues a step-end
marker. The sender thread sends what it gathered when the marker arrives. An output never
waits longer than ``MAX_HOLD_S`` for its marker, and reports from other threads (a
request the engine refused, statistics, ``Ready``, ``Fatal``) go at once.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

import msgspec

from mstar.server.messages import Event, Events, report_encoder
from mstar.server.tensor_codec import TensorCodec

log = logging.getLogger("mstar.engine_process")

MAX_HOLD_S = 0.002  # the longest an output waits for its step's end
_STEP_END = object()
_STOP = object()


class RequestSink:
    """Engine-thread side of one request: drops signals the API did not ask for."""

    __slots__ = ("sender", "wanted")

    def __init__(self, sender: ReportSender, wanted: frozenset[str] | None) -> None:
        self.sender = sender
        self.wanted = wanted

    def put(self, out: Any) -> None:
        if (
            self.wanted is not None
            and out.signal is not None
            and not out.finished
            and not out.stream_item
            and not out.stream_closed
            and out.signal not in self.wanted
        ):
            return
        self.sender.step_outputs = True
        self.sender.outbox.put(out)


class ReportSender:
    def __init__(self, engine_name: str, codec: TensorCodec, max_hold_s: float = MAX_HOLD_S, max_message_bytes: int = 0) -> None:
        self.engine_name = engine_name
        self.codec = codec
        self.max_hold_s = max_hold_s
        # The API's report socket refuses larger frames (ipc_auth.max_message_bytes; 0: none).
        self.max_message_bytes = max_message_bytes
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        # Whether this step queued anything; touched by the engine thread only.
        self.step_outputs = False

    def sink(self, wanted: frozenset[str] | None) -> RequestSink:
        return RequestSink(self, wanted)

    def step_ended(self) -> None:
        """The engine's step listener (engine thread): this step's outputs are all queued."""
        if self.step_outputs:
            self.step_outputs = False
            self.outbox.put(_STEP_END)

    def put(self, report: msgspec.Struct) -> None:
        """A report from any thread, sent at once (with what was gathered before it)."""
        self.outbox.put(report)

    def stop(self) -> None:
        """Send what is queued, then end ``run``."""
        self.outbox.put(_STOP)

    def run(self, sock: Any) -> None:
        """The sender thread's loop, until ``stop``."""
        pending: list[Event] = []
        deadline = 0.0
        while True:
            try:
                if pending:
                    item = self.outbox.get(timeout=max(deadline - time.monotonic(), 0.0))
                else:
                    item = self.outbox.get()
            except queue.Empty:
                item = _STEP_END  # held long enough: send without the marker
            if item is _STEP_END or item is _STOP or isinstance(item, msgspec.Struct):
                if isinstance(item, Event):  # a refused request, from the command thread
                    pending.append(item)
                if pending:
                    self._send_events(sock, pending)
                    pending = []
                if item is _STOP:
                    return
                if isinstance(item, msgspec.Struct) and not isinstance(item, Event):
                    sock.send(report_encoder.encode(item))
            else:
                if not pending:
                    deadline = time.monotonic() + self.max_hold_s
                pending.append(self._event(item))

    def _send_events(self, sock: Any, events: list[Event]) -> None:
        """``events`` as one message, or halves of it while it would exceed the cap."""
        raw = report_encoder.encode(Events(self.engine_name, events))
        if self.max_message_bytes and len(raw) > self.max_message_bytes and len(events) > 1:
            half = len(events) // 2
            self._send_events(sock, events[:half])
            self._send_events(sock, events[half:])
            return
        sock.send(raw)

    def _event(self, out: Any) -> Event:
        return Event(
            out.request_id,
            out.signal,
            self.codec.encode(out.data) if out.data is not None else None,
            out.stream_item,
            out.stream_closed,
            out.finished,
            out.finish_reason,
            out.error,
            out.error_type,
        )
