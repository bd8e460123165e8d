"""The API process's handle on one engine process: spawn, command socket, liveness."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from mstar.server.engine_process import EngineProcessSpec, run_engine_process
from mstar.server.messages import EngineStats, command_encoder

log = logging.getLogger("mstar.server")


class EngineHandle:
    def __init__(self, spec: EngineProcessSpec, ctx: zmq.Context) -> None:
        self.spec = spec
        self.name = spec.name
        self.nodes = tuple(spec.nodes)
        self.process: Any = None
        # We connect, the engine binds: a connecting PUSH queues commands until the peer is up.
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(spec.command_addr)
        self.ready = False
        self.down_reason: str | None = None
        self.stats: EngineStats | None = None

    @property
    def alive(self) -> bool:
        return self.down_reason is None and self.process is not None and self.process.is_alive()

    @property
    def serving(self) -> bool:
        """Alive and past its ``Ready``: requests may be sent to it."""
        return self.ready and self.alive

    def describe(self) -> dict[str, Any]:
        """Where it runs, for /health (a Ray engine adds its node and address)."""
        return {}

    def reap(self) -> None:
        """Collect the exit status of a process that ended (no zombie left behind)."""
        if self.process is not None:
            self.process.join(timeout=1.0)

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.process = ctx.Process(
            target=run_engine_process,
            args=(msgspec.msgpack.encode(self.spec),),
            name=f"mstar-engine-{self.name}",
            daemon=True,
        )
        self.process.start()
        log.info("engine %s (nodes %s, %s) started as pid %s", self.name, list(self.nodes), self.spec.device, self.process.pid)

    def watch(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[EngineHandle], None]) -> None:
        """Call ``on_exit`` the moment the process ends (its sentinel becomes readable)."""
        sentinel = self.process.sentinel

        def fire() -> None:
            loop.remove_reader(sentinel)
            on_exit(self)

        loop.add_reader(sentinel, fire)

    def send(self, cmd: Any) -> None:
        self.sock.send_multipart([self.spec.secret, command_encoder.encode(cmd)], zmq.NOBLOCK)

    def unavailable_reason(self) -> str:
        return self.down_reason or ("is starting" if self.alive else "is not running")

    def mark_down(self, reason: str) -> None:
        if self.down_reason is None:
            self.down_reason = reason

    def exit_description(self) -> str:
        code = self.process.exitcode if self.process is not None else None
        if code is None:
            return "is not running"
        if code < 0:
            return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def stop(self, timeout: float = 5.0) -> None:
        """Ask for a clean exit, then terminate, then kill: never leave it running."""
        if self.process is None:
            return
        if self.process.is_alive():
            try:
                from mstar.server.messages import Shutdown

                self.send(Shutdown())
            except zmq.ZMQError:
                pass
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
        self.sock.close(linger=0)
