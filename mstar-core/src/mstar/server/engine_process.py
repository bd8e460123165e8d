"""An engine process: one ``mstar.Engine`` over the nodes of one device group.

Commands arrive on a PULL socket (main thread); outputs leave on a PUSH socket from a
sender thread, one message per engine step (``mstar.server.report_sender``); statistics
come from a thread of their own (``mstar.server.engine_stats``). The API process runs the
warm-up request through the normal path once every engine reported ``Ready``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import msgspec

from mstar.engine.errors import classify_error
from mstar.server.engine_stats import StatsReporter, engine_stats
from mstar.server.gc_freeze import freeze_startup_objects
from mstar.server.ipc_auth import SignedSocket, authenticated, cap_frames
from mstar.server.messages import (
    AbortRequest,
    AddRequest,
    CloseStream,
    Event,
    Fatal,
    PushStream,
    Ready,
    Shutdown,
    command_decoder,
)
from mstar.server.parent_death import die_with_parent
from mstar.server.report_sender import ReportSender
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
    secret: bytes = b""  # the server's per-run secret in front of every message (ipc_auth)
    max_message_bytes: int = 0  # the largest frame the command socket accepts (0: no cap)
    tensor_parallel: int = 1  # ranks of this engine (mstar.server.tensor_parallel_ranks); this process is rank 0
    expert_parallel: bool = False  # with tensor_parallel: whole experts placed on the ranks


def run_engine_process(spec_bytes: bytes) -> None:
    """Entry point of the spawned process."""
    spec = msgspec.msgpack.decode(spec_bytes, type=EngineProcessSpec)
    logging.basicConfig(level=spec.log_level.upper(), format=f"%(asctime)s engine[{spec.name}] %(levelname)s %(message)s")
    # The API process owns shutdown: Ctrl-C in a terminal reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()

    def on_sigterm(*_: object) -> None:
        if os.getppid() != spec.parent_pid:  # PR_SET_PDEATHSIG: the API process died
            _clean_up_after_dead_parent(spec)
            os._exit(0)
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    # A crashed or killed API process must not leave this engine running.
    die_with_parent(signal.SIGTERM, spec.parent_pid)
    raise SystemExit(EngineWorker(spec, stop).run())


def _clean_up_after_dead_parent(spec: EngineProcessSpec) -> None:
    """What the API process would have removed at shutdown: this server's shared-memory
    segments and its socket folder (every engine tries; whichever comes first wins)."""
    import shutil
    from pathlib import Path

    from mstar.server.tensor_codec import cleanup_segments

    log.warning("API process exited; engine %s stops", spec.name)
    cleanup_segments(spec.shm_prefix)
    for addr in (spec.command_addr, spec.report_addr):
        if addr.startswith("ipc://"):
            folder = Path(addr.removeprefix("ipc://")).parent
            if folder.name.startswith("mstar-"):
                shutil.rmtree(folder, ignore_errors=True)


class EngineWorker:
    def __init__(self, spec: EngineProcessSpec, stop: threading.Event) -> None:
        import zmq

        self.spec = spec
        self.stop = stop
        self.codec = TensorCodec(spec.shm_prefix, spec.shm_threshold)
        self.sender = ReportSender(spec.name, self.codec, max_message_bytes=spec.max_message_bytes)
        self.ctx = zmq.Context()
        self.engine: Any = None
        self.reporter: StatsReporter | None = None
        self._warm_frozen = False
        self.followers: list[Any] = []  # tensor-parallel ranks 1..N-1 (their processes)

    def _freeze_after_warm_up(self) -> None:
        """Once the first request (the server's warm-up) has left and nothing runs: freeze
        again, so what the first forwards made (compiled kernels' caches, lazily built
        tables, the plugin's first-use state) is kept out of the collector too. Once."""
        engine = self.engine
        if self._warm_frozen or not engine.stats_requests() or engine.core.running or engine.core.waiting:
            return
        self._warm_frozen = True
        freeze_startup_objects(f"engine {self.spec.name} after its first request")

    def run(self) -> int:
        sender_thread = threading.Thread(target=self._send_loop, name="mstar-sender", daemon=True)
        sender_thread.start()
        try:
            self.engine = self._build()
        except BaseException as exc:
            log.exception("engine %s failed to start", self.spec.name)
            self.sender.put(Fatal(self.spec.name, f"{type(exc).__name__}: {exc}"))
            self._stop_followers()
            self._finish(sender_thread)
            return 1
        freeze_startup_objects(f"engine {self.spec.name}")
        commands = self._command_socket()
        # Before any request: every step's outputs leave as one message.
        self.engine.add_step_listener(self.sender.step_ended)
        self.engine.add_step_listener(self._freeze_after_warm_up)
        self.sender.put(Ready(self.spec.name, os.getpid(), list(self.spec.nodes), engine_stats(self.engine)))
        self.reporter = StatsReporter(self.spec.name, self.engine, self.sender.put, self.spec.stats_interval_s)
        self.reporter.start()
        code = 0
        try:
            code = self._command_loop(commands)
        finally:
            log.debug("stopping")
            self.reporter.stop()
            self.engine.close()
            self._stop_followers()
            commands.close(linger=0)
            self._finish(sender_thread)
            log.debug("stopped")
        return code

    def _command_socket(self) -> Any:
        """The bound PULL socket commands arrive on (``mstar.server.ray_engines`` hands over
        one it bound on its node's TCP address before the build)."""
        import zmq

        sock = self.ctx.socket(zmq.PULL)
        cap_frames(sock, self.spec.max_message_bytes)
        sock.bind(self.spec.command_addr)
        return sock

    def _build(self) -> Any:
        from mstar.server.tensor_parallel_ranks import build_engine, free_port, start_followers

        t0 = time.perf_counter()
        init = ""
        if self.spec.tensor_parallel > 1:
            init = f"tcp://127.0.0.1:{free_port()}"
            self.followers = start_followers(self.spec, init)
        engine = build_engine(self.spec, 0, init)
        dtypes = {name: sorted({str(p.dtype).removeprefix("torch.") for p in node.submodule.parameters()})
                  for name, node in engine.core.nodes.items()}
        ranks = f" (rank 0 of {self.spec.tensor_parallel})" if self.spec.tensor_parallel > 1 else ""
        log.info("built nodes %s on %s%s in %.1fs", dtypes, self.spec.device, ranks, time.perf_counter() - t0)
        return engine

    def _command_loop(self, commands: Any) -> int:
        import zmq

        from mstar.server.memory_trim import MemoryTrimmer, glibc_malloc_trim

        poller = zmq.Poller()
        poller.register(commands, zmq.POLLIN)
        trimmer = MemoryTrimmer(glibc_malloc_trim())
        core = self.engine.core
        while not self.stop.is_set():
            trimmer.tick(core.stats.steps, len(core.running) + len(core.waiting))
            if poller.poll(200):
                while True:
                    try:
                        frames = commands.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if not self._handle_message(frames):
                        return 0
            if os.getppid() != self.spec.parent_pid:  # the API process is gone: no orphans, no leftovers
                _clean_up_after_dead_parent(self.spec)
                return 0
            if self.engine.fatal_error:
                self.sender.put(Fatal(self.spec.name, self.engine.fatal_error))
                return 1
        return 0

    def _handle_message(self, frames: list[bytes]) -> bool:
        """One message off the command socket; anything malformed is logged and dropped,
        never fatal. Returns False on ``Shutdown``."""
        raw = authenticated(frames, self.spec.secret, f"engine {self.spec.name} command socket")
        if raw is None:
            return True
        try:
            cmd = command_decoder.decode(raw)
        except Exception as exc:
            log.warning("engine %s: dropped an undecodable command (%d bytes): %s", self.spec.name, len(raw), exc)
            return True
        try:
            return self._handle(cmd)
        except Exception:
            log.exception("engine %s: command %s failed; dropped", self.spec.name, type(cmd).__name__)
            return True

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
                    _sink=self.sender.sink(frozenset(cmd.signals) if cmd.signals is not None else None),
                )
            except Exception as exc:  # a bad request fails alone
                self.sender.put(Event(
                    cmd.request_id, finished=True, finish_reason="error",
                    error=f"{type(exc).__name__}: {exc}", error_type=classify_error(exc, "admission"),
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
            self.sender.run(SignedSocket(sock, self.spec.secret))
        finally:
            sock.close(linger=2000)

    def _stop_followers(self) -> None:
        """Tensor-parallel ranks: after a normal close they have left their loop; after a
        failure (a rank died, a collective failed) the rest are killed."""
        from mstar.server.tensor_parallel_ranks import stop_followers

        timeout = 1.0 if self.engine is None or self.engine.fatal_error else 10.0
        stop_followers(self.followers, timeout)

    def _finish(self, sender_thread: threading.Thread) -> None:
        self.sender.stop()
        sender_thread.join(timeout=5)
        if sender_thread.is_alive():
            self.ctx.destroy(linger=0)
        else:
            self.ctx.term()
