"""An engine process: one ``mstar.Engine`` over the nodes of one device group.

Commands arrive on a PULL socket (main thread); outputs leave on a PUSH socket from a
sender thread that batches whatever accumulated since its last send into one message, so
a step's outputs for many requests cost one message. The API process runs the warm-up
request through the normal path once every engine reported ``Ready``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import Any

import msgspec

from mstar.server.engine_stats import StatsReporter, engine_stats
from mstar.server.messages import (
    AbortRequest,
    AddRequest,
    CloseStream,
    Event,
    Events,
    Fatal,
    PushStream,
    Ready,
    Shutdown,
    command_decoder,
    report_encoder,
)
from mstar.server.tensor_codec import TensorCodec

log = logging.getLogger("mstar.engine_process")


class EngineProcessSpec(msgspec.Struct):
    name: str
    model: str
    checkpoint_dir: str
    nodes: list[str]
    device: str
    command_addr: str
    report_addr: str
    shm_prefix: str
    shm_threshold: int
    parent_pid: int
    log_level: str = "info"
    engine_options: dict[str, Any] = {}
    stats_interval_s: float = 0.1
    torch_threads: int | None = None  # intra-op threads of this engine (None: torch's default)


SEND_COALESCE_S = 0.0005
_STOP = object()  # tells the sender thread to flush and exit


class _RequestSink:
    """Engine-thread side of one request: drops signals the API did not ask for."""

    __slots__ = ("outbox", "wanted")

    def __init__(self, outbox: queue.SimpleQueue, wanted: frozenset[str] | None) -> None:
        self.outbox = outbox
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
        self.outbox.put(out)


def _add_error_type(exc: Exception) -> str:
    """``add_request`` rejects a request's own values (inputs, sampling) with these;
    anything else (the engine is down, a bug) is internal."""
    return "invalid_request" if isinstance(exc, ValueError | TypeError | KeyError) else "internal"


def run_engine_process(spec_bytes: bytes) -> None:
    """Entry point of the spawned process."""
    spec = msgspec.msgpack.decode(spec_bytes, type=EngineProcessSpec)
    logging.basicConfig(level=spec.log_level.upper(), format=f"%(asctime)s engine[{spec.name}] %(levelname)s %(message)s")
    # The API process owns shutdown: Ctrl-C in a terminal reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    raise SystemExit(EngineWorker(spec, stop).run())


class EngineWorker:
    def __init__(self, spec: EngineProcessSpec, stop: threading.Event) -> None:
        import zmq

        self.spec = spec
        self.stop = stop
        self.codec = TensorCodec(spec.shm_prefix, spec.shm_threshold)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.ctx = zmq.Context()
        self.engine: Any = None
        self.reporter: StatsReporter | None = None

    def run(self) -> int:
        import zmq

        sender = threading.Thread(target=self._send_loop, name="mstar-sender", daemon=True)
        sender.start()
        try:
            self.engine = self._build()
        except BaseException as exc:
            log.exception("engine %s failed to start", self.spec.name)
            self.outbox.put(Fatal(self.spec.name, f"{type(exc).__name__}: {exc}"))
            self._finish(sender)
            return 1
        commands = self.ctx.socket(zmq.PULL)
        commands.bind(self.spec.command_addr)
        self.outbox.put(Ready(self.spec.name, os.getpid(), list(self.spec.nodes), engine_stats(self.engine)))
        self.reporter = StatsReporter(self.spec.name, self.engine, self.outbox.put, self.spec.stats_interval_s)
        self.reporter.start()
        code = 0
        try:
            code = self._command_loop(commands)
        finally:
            log.debug("stopping")
            self.reporter.stop()
            self.engine.close()
            commands.close(linger=0)
            self._finish(sender)
            log.debug("stopped")
        return code

    def _build(self) -> Any:
        from pathlib import Path

        from mstar.engine.builder import EngineConfig, build_core
        from mstar.engine.engine import Engine
        from mstar.plugins.loading import load_model

        if self.spec.torch_threads:
            import torch

            torch.set_num_threads(self.spec.torch_threads)
        loaded = load_model(self.spec.model)
        config = EngineConfig(device=self.spec.device, nodes=tuple(self.spec.nodes), **self.spec.engine_options)
        ckpt = Path(self.spec.checkpoint_dir)
        t0 = time.perf_counter()
        engine = Engine(build_core(loaded, ckpt, config), loaded, ckpt)
        log.info("built nodes %s on %s in %.1fs", self.spec.nodes, self.spec.device, time.perf_counter() - t0)
        return engine

    def _command_loop(self, commands: Any) -> int:
        import zmq

        poller = zmq.Poller()
        poller.register(commands, zmq.POLLIN)
        while not self.stop.is_set():
            if poller.poll(200):
                while True:
                    try:
                        raw = commands.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if not self._handle(command_decoder.decode(raw)):
                        return 0
            if os.getppid() != self.spec.parent_pid:  # the API process is gone: no orphans
                log.warning("API process exited; engine %s stops", self.spec.name)
                return 0
            if self.engine.fatal_error:
                self.outbox.put(Fatal(self.spec.name, self.engine.fatal_error))
                return 1
        return 0

    def _handle(self, cmd: Any) -> bool:
        engine = self.engine
        if isinstance(cmd, AddRequest):
            try:
                engine.add_request(
                    {k: self.codec.decode(v) for k, v in cmd.inputs.items()},
                    cmd.sampling,
                    cmd.kwargs,
                    request_id=cmd.request_id,
                    priority=cmd.priority,
                    _sink=_RequestSink(self.outbox, frozenset(cmd.signals) if cmd.signals is not None else None),
                )
            except Exception as exc:  # a bad request fails alone
                self.outbox.put(Event(
                    cmd.request_id, finished=True, finish_reason="error",
                    error=f"{type(exc).__name__}: {exc}", error_type=_add_error_type(exc),
                ))
        elif isinstance(cmd, AbortRequest):
            engine.abort(cmd.request_id)
        elif isinstance(cmd, PushStream):
            engine.push_stream(cmd.request_id, cmd.signal, self.codec.decode(cmd.value))
        elif isinstance(cmd, CloseStream):
            engine.close_stream(cmd.request_id, cmd.signal)
        elif isinstance(cmd, Shutdown):
            return False
        return True

    # ---- sender thread -------------------------------------------------------------------
    def _send_loop(self) -> None:
        import zmq

        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(self.spec.report_addr)
        try:
            while True:
                items = [self.outbox.get()]
                last = self.reporter.last if self.reporter is not None else None
                if last is not None and last.running > 1:
                    # Let the engine thread finish handing out this step's outputs: one
                    # message per step, and no GIL ping-pong per output.
                    time.sleep(SEND_COALESCE_S)
                while True:
                    try:
                        items.append(self.outbox.get_nowait())
                    except queue.Empty:
                        break
                events: list[Event] = []
                done = False
                for item in items:
                    if item is _STOP:
                        done = True
                    elif isinstance(item, Event):
                        events.append(item)
                    elif isinstance(item, msgspec.Struct):
                        if events:
                            sock.send(report_encoder.encode(Events(self.spec.name, events)))
                            events = []
                        sock.send(report_encoder.encode(item))
                    else:
                        events.append(self._event(item))
                if events:
                    sock.send(report_encoder.encode(Events(self.spec.name, events)))
                if done:
                    return
        finally:
            sock.close(linger=2000)

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

    def _finish(self, sender: threading.Thread) -> None:
        self.outbox.put(_STOP)
        sender.join(timeout=5)
        if sender.is_alive():
            self.ctx.destroy(linger=0)
        else:
            self.ctx.term()
