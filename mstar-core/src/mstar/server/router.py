"""Routing requests to engine processes and their outputs back to the HTTP handlers.

Every group holding a partition the request runs gets it (an engine runs only the
partitions whose nodes it holds); in a replicated group, one replica, picked at submission
(``mstar.server.replicas``). Stream items an engine emits for a partition in another group
are forwarded to the request's replica there; a request ends when every engine finished it,
or at once when one fails.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mstar.api.errors import ApiError
from mstar.server.engine_handle import EngineHandle
from mstar.server.messages import AbortRequest, AddRequest, CloseStream, Event, PushStream
from mstar.server.replicas import Policy, ReplicaStats, choose_replica
from mstar.server.tensor_codec import TensorCodec

log = logging.getLogger("mstar.server")

# When engines disagree on why a request ended, the most telling reason wins.
_REASON_RANK = {"error": 4, "abort": 3, "length": 2}

# An engine's error type as the client sees it: (HTTP status, OpenAI error code). Bad
# input and a prompt that can never fit are the caller's (400, like OpenAI's
# context_length_exceeded); anything else is ours (500).
ENGINE_ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_value"),
    "too_large": (400, "context_length_exceeded"),
    "internal": (500, "engine_error"),
}
_EXC_PREFIX = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what msgpack (and torch seeds) can carry


def _bad_int(value: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT_RANGE[0] <= value <= _INT_RANGE[1] else path
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        found = _bad_int(item, (*path, str(key)))
        if found:
            return found
    return None


def check_wire_values(sampling: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """A 400 naming the field for an integer no engine message can carry (beyond 64 bits)."""
    found = _bad_int(sampling, ())
    if found:
        # {node: {"main": {field}}} is the request's own field; aux fields sit under sampling.aux.
        param = found[2] if len(found) > 2 and found[1] == "main" else "sampling." + ".".join(found[1:])
    else:
        found = _bad_int(kwargs, ())
        param = "kwargs." + ".".join(found) if found else None
    if param is not None:
        raise ApiError(400, f"{param}: integer out of range (at most 64 bits)", param=param, code="invalid_value")


@dataclass(frozen=True)
class Finished:
    reason: str
    error: str | None = None
    status: int = 500  # HTTP status for an error
    code: str | None = None  # OpenAI error code for an error (None: "engine_error")


def engine_failure(error: str | None, error_type: str | None) -> Finished:
    """The ``Finished`` of a request an engine failed; an unknown type is internal. The
    client never sees a Python exception name (the engine's log has the traceback)."""
    status, code = ENGINE_ERRORS.get(error_type or "internal", ENGINE_ERRORS["internal"])
    message = _EXC_PREFIX.sub("", error or "") or "engine error"
    if status >= 500:
        message = f"the engine failed while running this request: {message}"
    return Finished("error", message, status, code)


class BufferTotal:
    """Output bytes queued and not yet taken, over every request of a router."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class RequestStream:
    """One request's outputs: ``(signal, tensor)`` items, then one ``Finished``.
    ``buffered`` counts the tensor bytes queued and not yet taken by the response (and
    ``total``, when given, the same bytes summed over requests)."""

    __slots__ = ("request_id", "queue", "pending", "routes", "reason", "done", "buffered", "on_finish", "total")

    def __init__(self, request_id: str, engines: set[str], routes: dict[str, str] | None = None,
                 total: BufferTotal | None = None) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[tuple[str, torch.Tensor] | Finished] = asyncio.Queue()
        self.pending = set(engines)
        # group -> the engine (replica) running the request there
        self.routes = routes if routes is not None else {e: e for e in engines}
        self.reason = "stop"
        self.done = False
        self.buffered = 0
        self.on_finish: Callable[[], None] | None = None  # called once, when it ends
        self.total = total if total is not None else BufferTotal()

    def put(self, signal: str, value: torch.Tensor) -> None:
        self.buffered += value.nbytes
        self.total.bytes += value.nbytes
        self.queue.put_nowait((signal, value))

    def _taken(self) -> None:
        self.total.bytes -= self.buffered
        self.buffered = 0

    def drop_queued(self) -> None:
        """Free what is queued (nobody will read it); the ``Finished`` item too."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self._taken()

    def release(self) -> None:
        """Free the queued output of a response that ends (its ``Finished`` stays queued)."""
        items = []
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        for item in items:
            if isinstance(item, Finished):
                self.queue.put_nowait(item)
        self._taken()

    def finish(self, fin: Finished, drop_queued: bool = False) -> None:
        if not self.done:
            self.done = True
            if drop_queued:  # nobody will read them: free them now
                self.drop_queued()
            self.queue.put_nowait(fin)
            if self.on_finish is not None:
                self.on_finish()

    async def next_batch(self) -> list[tuple[str, torch.Tensor] | Finished]:
        """Everything queued (at least one item): lets a slow consumer coalesce."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        self._taken()
        return items


class Router:
    def __init__(
        self,
        engines: dict[str, EngineHandle],
        stream_routes: dict[str, str],
        codec: TensorCodec,
        max_buffer_bytes: int | None = None,
        max_total_buffer_bytes: int | None = None,
        engines_for: Callable[[dict[str, Any]], set[str]] | None = None,
        replicas: dict[str, tuple[str, ...]] | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.engines = engines
        self.stream_routes = stream_routes  # signal -> the group consuming it
        self.codec = codec
        # Which groups a request's walks run on (by its kwargs); None: all of them.
        self.engines_for = engines_for
        # group -> its engines, one per replica; None: each engine is a group of its own.
        self.replicas = replicas
        self.policy = policy  # picks a replica (None: the default policy)
        # request id -> replica index it must use in every replicated group (the warm-up
        # reaches each replica this way); taken when the request is submitted.
        self.pinned: dict[str, int] = {}
        self.streams: dict[str, RequestStream] = {}
        # Output bytes a request may have waiting for a client that does not read; beyond
        # it the request is aborted (its cache freed) instead of growing memory without end.
        self.max_buffer_bytes = max_buffer_bytes
        # The same over all requests together: beyond it the request with the most output
        # waiting (the slowest reader) is aborted, whichever request's output came last.
        self.max_total_buffer_bytes = max_total_buffer_bytes
        self.buffered = BufferTotal()

    def submit(
        self,
        request_id: str,
        inputs: dict[str, torch.Tensor],
        sampling: dict[str, Any],
        kwargs: dict[str, Any],
        signals: list[str] | None,
    ) -> RequestStream:
        try:  # the model's walk choice reads the kwargs: a bad one is the caller's error
            groups = self.engines_for(kwargs) if self.engines_for is not None else set(self.replicas or self.engines)
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_request") from None
        check_wire_values(sampling, kwargs)
        pin = self.pinned.pop(request_id, None)
        routes = {g: self._pick(g, kwargs, signals, pin) for g in sorted(groups)}
        targets = [self.engines[routes[g]] for g in sorted(groups)]
        down = [e for e in targets if not e.serving]
        if down:
            raise ApiError(503, f"engine {down[0].name!r} {down[0].unavailable_reason()}; retry later", code="engine_unavailable")
        stream = RequestStream(request_id, set(routes.values()), routes, self.buffered)
        self.streams[request_id] = stream
        sent: list[str] = []
        try:
            for group in sorted(groups):
                self._send_request(self.engines[routes[group]], AddRequest(request_id, {}, sampling, kwargs, signals), inputs)
                sent.append(routes[group])
        except BaseException:
            # Nothing of a request that could not be sent stays behind: its registration
            # goes, and the engines that did get it abort it.
            self.streams.pop(request_id, None)
            for name in sent:
                self._send(name, AbortRequest(request_id))
            raise
        return stream

    def _send_request(self, engine: EngineHandle, msg: AddRequest, inputs: dict[str, torch.Tensor]) -> None:
        """Send ``msg`` with ``inputs`` encoded for ``engine`` alone (a shared-memory segment is
        consumed by its one receiver); a send that fails frees the segments it made."""
        try:
            for name, value in inputs.items():
                msg.inputs[name] = self.codec.encode(value)
            engine.send(msg)
        except BaseException:
            for encoded in msg.inputs.values():
                self.codec.discard(encoded)
            raise

    def _engines_of(self, group: str) -> tuple[str, ...]:
        return self.replicas.get(group, (group,)) if self.replicas is not None else (group,)

    def _pick(self, group: str, kwargs: dict[str, Any], signals: list[str] | None, pin: int | None = None) -> str:
        names = self._engines_of(group)
        if len(names) == 1:
            return names[0]
        if pin is not None:
            return names[pin % len(names)]
        return names[choose_replica(self.policy, group, kwargs, signals, self.replica_stats(group))]

    def replica_stats(self, group: str) -> list[ReplicaStats]:
        out = []
        for i, name in enumerate(self._engines_of(group)):
            engine = self.engines[name]
            stats = engine.stats  # the latest report (None before the first)
            out.append(ReplicaStats(
                i, name, engine.spec.device, engine.serving, self.outstanding(name),
                stats.waiting if stats is not None else 0, stats.running if stats is not None else 0,
            ))
        return out

    def outstanding(self, engine: str) -> int:
        """Requests sent to ``engine`` that it has not finished."""
        return sum(1 for s in self.streams.values() if engine in s.pending)

    def abort(self, request_id: str) -> None:
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return
        stream.finish(Finished("abort"))
        for name in stream.pending:
            self._send(name, AbortRequest(request_id))

    def fail(self, request_id: str, fin: Finished) -> None:
        """End a request with an error now and abort it in every engine still holding it."""
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.finish(fin)
            self.abort(request_id)

    # ---- engine reports ---------------------------------------------------------------
    def on_events(self, engine: str, events: list[Event]) -> None:
        for ev in events:
            stream = self.streams.get(ev.request_id)
            if stream is None:
                if ev.value is not None and ev.value.shm is not None:
                    self.codec.decode(ev.value)  # still frees its segment
                continue
            if ev.stream_item or ev.stream_closed:
                self._forward(stream, ev)
            elif ev.finished:
                self._engine_finished(stream, engine, ev)
            elif ev.value is not None and ev.signal is not None:
                stream.put(ev.signal, self.codec.decode(ev.value))
                if self.max_buffer_bytes is not None and stream.buffered > self.max_buffer_bytes:
                    self._slow_reader(stream)
                elif self.max_total_buffer_bytes is not None and self.buffered.bytes > self.max_total_buffer_bytes:
                    self._slowest_reader()

    def _forward(self, stream: RequestStream, ev: Event) -> None:
        group = self.stream_routes.get(ev.signal or "")
        # The request's replica of the consuming group; a group it does not run in gets
        # the item only when it has one engine (which ignores it).
        engines = self._engines_of(group) if group is not None else ()
        target = stream.routes.get(group or "") or (engines[0] if len(engines) == 1 else None)
        if target is None:
            log.error("request %s: no engine consumes stream %r", stream.request_id, ev.signal)
            if ev.value is not None and ev.value.shm is not None:
                self.codec.decode(ev.value)  # still frees its segment
            return
        if ev.stream_item and ev.value is not None:
            # Passed on as it came: the consuming engine decodes it (and frees its shared
            # memory segment), so an item crosses this process without a copy.
            if not self._send(target, PushStream(stream.request_id, ev.signal or "", ev.value)):
                self.codec.discard(ev.value)
        else:
            self._send(target, CloseStream(stream.request_id, ev.signal or ""))

    def _engine_finished(self, stream: RequestStream, engine: str, ev: Event) -> None:
        stream.pending.discard(engine)
        reason = ev.finish_reason or "stop"
        if _REASON_RANK.get(reason, 1) > _REASON_RANK.get(stream.reason, 0):
            stream.reason = reason
        if ev.error or reason == "error":
            fin = engine_failure(ev.error, ev.error_type)
            if fin.status >= 500:
                log.error("request %s failed in engine %s: %s", stream.request_id, engine, ev.error)
            self.fail(stream.request_id, fin)
        elif reason == "abort" and stream.pending:
            self.abort(stream.request_id)
        elif not stream.pending:
            self.streams.pop(stream.request_id, None)
            stream.finish(Finished(stream.reason))

    def _slow_reader(self, stream: RequestStream) -> None:
        log.warning("request %s: its client is not reading (%d bytes of output waiting); aborting it", stream.request_id, stream.buffered)
        message = f"the client did not read its response: more than {self.max_buffer_bytes} bytes of output waited; the request was aborted"
        stream.finish(Finished("error", message, 408, "output_buffer_full"), drop_queued=True)
        self.abort(stream.request_id)

    def _slowest_reader(self) -> None:
        """Over the total cap: abort the running request with the most output waiting until
        the total is back under it."""
        cap = self.max_total_buffer_bytes
        assert cap is not None
        while self.buffered.bytes > cap:
            waiting = [s for s in self.streams.values() if s.buffered > 0]
            if not waiting:
                return  # what is left waits in finished requests, freed as they are read or closed
            stream = max(waiting, key=lambda s: s.buffered)
            log.warning("request %s: output waiting for all clients is over the total cap of %d bytes; aborting the slowest "
                        "reader (%d bytes waiting)", stream.request_id, cap, stream.buffered)
            message = (f"the client did not read its response fast enough: output waiting for all clients went over the "
                       f"server's total of {cap} bytes, and this request had the most ({stream.buffered} bytes); it was aborted")
            stream.finish(Finished("error", message, 408, "output_buffer_full"), drop_queued=True)
            self.abort(stream.request_id)

    def engine_down(self, name: str, reason: str) -> None:
        """Fail, promptly, every request the engine held."""
        for rid, stream in list(self.streams.items()):
            if name in stream.pending:
                stream.pending.discard(name)
                self.fail(rid, Finished("error", f"engine {name!r} {reason}", 503))

    def _send(self, engine: str, cmd: Any) -> bool:
        """Whether ``cmd`` went out (a dead or unknown engine gets nothing)."""
        handle = self.engines.get(engine)
        if handle is None or not handle.alive:
            return False
        try:
            handle.send(cmd)
        except Exception as exc:  # a dead peer: its monitor reports it
            log.warning("could not send to engine %s: %s", engine, exc)
            return False
        return True
