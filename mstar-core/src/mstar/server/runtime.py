"""The API process's runtime: the model's adapter, engine processes, router, preprocess
pool, admission and metrics, with start-up (engines ready, warm-up) and shutdown."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from mstar.api.errors import ApiError
from mstar.model.precision import canonical_dtype
from mstar.server.admission import Admission
from mstar.server.config import ServerConfig
from mstar.server.engine_backend import make_backend
from mstar.server.engine_handle import EngineHandle
from mstar.server.engine_process import EngineProcessSpec
from mstar.server.gc_freeze import freeze_startup_objects
from mstar.server.ipc_auth import authenticated, cap_frames, max_message_bytes, new_secret
from mstar.server.messages import Events, Fatal, Ready, Stats, report_decoder
from mstar.server.metrics import MetricFamilies, ServerMetrics
from mstar.server.placement import Placement, load_placement, request_engines, validate_placement
from mstar.server.preprocess import PreprocessPool, load_adapter
from mstar.server.replicas import hook_policy
from mstar.server.router import Finished, Router
from mstar.server.startup_progress import StartupProgress
from mstar.server.supervisor import Supervisor
from mstar.server.tensor_codec import TensorCodec, cleanup_segments
from mstar.server.voice_library import VoiceLibrary, default_voices_dir

log = logging.getLogger("mstar.server")


class StartupError(RuntimeError):
    pass


def _check_engine_options(options: dict[str, Any]) -> None:
    """Fail in the API process, in one line, before spawning engines that would fail."""
    from dataclasses import fields

    from mstar.engine.builder import EngineConfig

    allowed = {f.name for f in fields(EngineConfig)} - {"device", "nodes"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(allowed)}")
    if "dtype" in options:
        canonical_dtype(options["dtype"])


class ServerRuntime:
    def __init__(self, config: ServerConfig, checkpoint_dir: Path, metrics: MetricFamilies | None = None) -> None:
        """One model's runtime; ``metrics``: the server's families when it serves several
        models (each runtime then reports under its own ``model`` label)."""
        self.config = config
        self.checkpoint_dir = checkpoint_dir
        self.loaded, self.adapter = load_adapter(config.model, checkpoint_dir)
        self.spec = self.loaded.spec
        # The name in the API (--served-model-name); engines and plugins use the spec's.
        self.model_name = config.served_model_names[0] if config.served_model_names else self.spec.name
        self.model_config = self.spec.load_config(checkpoint_dir)
        self.graph = self.spec.build_graph(self.model_config)
        self.node_samplers = self.loaded.hook.mstar_node_samplers(config=self.model_config) or {}
        # A default placement may name nodes only some checkpoints of the model have.
        default = {n: g for n, g in self.spec.default_placement.items() if n in self.graph.nodes}
        self.placement: Placement = load_placement(config.placement, default, config.device)
        validate_placement(self.placement, self.graph)
        _check_engine_options(config.engine_options)
        self.created = int(time.time())
        self.metrics = ServerMetrics(self.model_name, metrics)
        self.admission = Admission(config.max_concurrency, config.max_queue, self._admission_changed)
        self.preprocess = PreprocessPool(self.spec.name, checkpoint_dir, self.adapter, self.loaded.hook, config.preprocess_workers)
        self.voices = VoiceLibrary(Path(config.voices_dir) if config.voices_dir else default_voices_dir(), self.spec.name, self.model_config)
        # A per-server prefix: shared-memory segments and sockets of this server only.
        self.token = secrets.token_hex(4)
        self.shm_prefix = f"mstar_{self.token}_"
        self.ipc_secret = new_secret()
        # Where engines run (local processes or Ray actors) and so how they are reached.
        self.backend = make_backend(config.placement_backend, self.placement, config.ray_address)
        self.shm_threshold = self.backend.shm_threshold(config.shm_threshold)
        self.codec = TensorCodec(self.shm_prefix, self.shm_threshold)
        self.max_message_bytes = max_message_bytes(self.shm_threshold, config.max_body_bytes)
        self.ipc_dir = Path(tempfile.mkdtemp(prefix="mstar-"))
        self.zctx = zmq.Context()
        self.actx = zmq.asyncio.Context()
        self.engines: dict[str, EngineHandle] = {}
        self.router = Router(
            self.engines, self.placement.stream_routes(self.graph), self.codec, config.max_stream_buffer_bytes, config.max_stream_buffer_total_bytes,
            engines_for=request_engines(self.graph, self.placement),
            replicas=self.placement.group_engines(), policy=hook_policy(self.loaded.hook, self.spec.name),
        )
        self._slots = {slot.name: slot for slot in self.placement.engine_slots()}
        self._reports: Any = None
        self._receiver: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self.supervisor = Supervisor(config.restart_engines, config.max_engine_restarts, config.engine_restart_window_s)
        self.started = False
        self.draining = False
        self._drain_deadline = 0.0
        self.stop_requested: Callable[[], bool] = lambda: False
        self._progress: StartupProgress | None = None  # while starting

    # ---- identity -------------------------------------------------------------------------
    def served_names(self) -> set[str]:
        return set(self.config.served_model_names) or {self.spec.name, *self.spec.aliases}

    def check_model(self, name: str) -> None:
        if name not in self.served_names():
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}", param="model", code="model_not_found")

    @property
    def healthy(self) -> bool:
        """Started, not draining, and every group has a serving engine (a replicated group
        serves on while one replica is down or restarting)."""
        groups = self.placement.group_engines().values()
        return self.started and not self.draining and all(any(self.engines[n].serving for n in names) for names in groups)

    def status(self) -> str:
        if self.healthy:
            return "ok" if all(e.serving for e in self.engines.values()) else "replica_down"
        if self.draining:
            return "draining"
        return "restarting" if self.supervisor.pending() else "unhealthy"

    def retry_after_s(self) -> int:
        """A client's sensible wait before retrying a 503 (whole seconds)."""
        if self.draining:
            return max(1, math.ceil(self._drain_deadline - time.monotonic()) + 1)
        return self.supervisor.retry_after_s() if self.supervisor.pending() else 5

    def health(self) -> dict[str, Any]:
        return {
            "status": self.status(),
            "model": self.model_name,
            "engines": {
                name: {
                    "alive": e.alive,
                    "pid": e.process.pid if e.process is not None else None,
                    "nodes": list(e.nodes),
                    "device": e.spec.device,
                    **e.describe(),
                    "group": self._slots[name].group,
                    "replica": self._slots[name].replica,
                    **({"error": e.down_reason} if e.down_reason else {}),
                    **({"kv": {kv.node: msgspec.structs.asdict(kv) for kv in e.stats.kv}} if e.stats is not None else {}),
                    **({"output_cache": {c.node: msgspec.structs.asdict(c) for c in e.stats.output_cache}}
                       if e.stats is not None and e.stats.output_cache else {}),
                    **self.supervisor.describe(name),
                }
                for name, e in self.engines.items()
            },
        }

    # ---- start-up ---------------------------------------------------------------------------
    async def start(self, warm_up: Callable[[ServerRuntime], Awaitable[None]] | None = None) -> None:
        """Start the engines and the preprocess pool; then ``warm_up(self)`` (the server passes
        ``mstar.server.warmup.warm_up``) before the port opens."""
        loop = asyncio.get_running_loop()
        self._reports = self.actx.socket(zmq.PULL)
        cap_frames(self._reports, self.max_message_bytes)
        self._reports.bind(self.backend.report_address(self.ipc_dir))
        report_addr = self._reports.getsockopt_string(zmq.LAST_ENDPOINT)  # a wildcard port resolved
        self._ready = loop.create_future()
        self._report_addr = report_addr
        for name in self._slots:
            self.engines[name] = self._new_handle(name)
        self._receiver = asyncio.create_task(self._receive_loop())
        self.preprocess.start()
        for engine in self.engines.values():
            engine.start()
            engine.watch(loop, self._engine_exited)
        t0 = time.perf_counter()
        self._progress = StartupProgress(len(self.engines))
        try:
            await asyncio.gather(self._wait_ready(), self.preprocess.warm_up())
            log.info("engines ready in %.1fs; warming up", time.perf_counter() - t0)
            self._progress.warming_up()
            if warm_up is not None:
                await warm_up(self)
        finally:
            self._progress.done()
            self._progress = None
        freeze_startup_objects(f"API process, model {self.model_name}")
        self.started = True

    def _new_handle(self, name: str) -> EngineHandle:
        """A handle on a new process of engine ``name`` (a group, or one replica of a group;
        each generation binds its own command socket, so nothing sent to a dead one reaches
        its successor)."""
        index = list(self._slots).index(name)
        slot = self._slots[name]
        generation = self.supervisor.restarts(name)
        spec = EngineProcessSpec(
            name=slot.name,
            model=self.spec.name,
            checkpoint_dir=str(self.checkpoint_dir),
            nodes=list(slot.nodes),
            device=slot.device,
            command_addr=self.backend.command_address(self.ipc_dir, index, generation),
            report_addr=self._report_addr,
            shm_prefix=self.shm_prefix,
            shm_threshold=self.shm_threshold,
            parent_pid=os.getpid(),
            log_level=self.config.log_level,
            engine_options=dict(self.config.engine_options),
            torch_threads=self.config.engine_threads,
            secret=self.ipc_secret,
            max_message_bytes=self.max_message_bytes,
            tensor_parallel=slot.tensor_parallel,
            expert_parallel=slot.expert_parallel,
        )
        return self.backend.handle(spec, self.placement, self.zctx)

    async def _wait_ready(self) -> None:
        """Wait for every engine's ``Ready``; give up on a signal or the start-up timeout."""
        assert self._ready is not None
        deadline = time.monotonic() + self.config.startup_timeout_s
        while not self._ready.done():
            if self.stop_requested():
                raise StartupError("interrupted during start-up")
            if time.monotonic() > deadline:
                raise StartupError(f"engines not ready after {self.config.startup_timeout_s:g}s")
            await asyncio.wait([self._ready], timeout=0.1)
        self._ready.result()

    def _engine_exited(self, engine: EngineHandle) -> None:
        if self.engines.get(engine.name) is not engine:
            return  # a generation already replaced
        engine.reap()
        reason = engine.down_reason or f"process {engine.exit_description()}"
        engine.mark_down(reason)
        self.metrics.engine_up.labels(*self._labels(engine.name)).set(0)
        if not self._closing:
            log.error("engine %s %s; failing its requests", engine.name, reason)
        self.router.engine_down(engine.name, reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(StartupError(f"engine {engine.name!r} {reason} during start-up"))
            return
        if self.started and not self._closing:
            self.supervisor.exited(engine.name, reason, self._restart)

    def _restart(self, name: str) -> None:
        if self._closing:
            return
        old = self.engines[name]
        old.stop(timeout=0)  # already dead: this only closes its socket
        engine = self._new_handle(name)
        self.engines[name] = engine
        engine.start()
        engine.watch(asyncio.get_running_loop(), self._engine_exited)

    _closing = False

    async def _receive_loop(self) -> None:
        while True:
            frames = await self._reports.recv_multipart()
            # A queued message comes back without a pause: let requests run between them,
            # or a flood (of junk or of reports) would starve the event loop.
            await asyncio.sleep(0)
            raw = authenticated(frames, self.ipc_secret, "report socket")
            if raw is None:
                continue
            try:
                report = report_decoder.decode(raw)
            except Exception as exc:
                log.warning("report socket: dropped an undecodable report (%d bytes): %s", len(raw), exc)
                continue
            try:
                if isinstance(report, Events):
                    self.router.on_events(report.engine, report.events)
                elif isinstance(report, Stats):
                    self._engine_stats(report.engine, report.stats)
                elif isinstance(report, Ready):
                    self._engine_ready(report)
                elif isinstance(report, Fatal):
                    engine = self.engines.get(report.engine)
                    if engine is not None:
                        engine.mark_down(f"failed: {report.error}")
                        log.error("engine %s failed: %s", report.engine, report.error)
                        if self._ready is not None and not self._ready.done():
                            self._ready.set_exception(StartupError(f"engine {report.engine!r} failed to start: {report.error}"))
            except Exception:
                log.exception("report from engine %s: handling failed; dropped", getattr(report, "engine", "?"))

    def _engine_ready(self, report: Ready) -> None:
        engine = self.engines[report.engine]
        engine.ready = True
        self._engine_stats(report.engine, report.stats)  # metrics now describe this process
        self.metrics.engine_up.labels(*self._labels(report.engine)).set(1)
        self.supervisor.ready(report.engine)
        log.info("engine %s ready (pid %s)", report.engine, report.pid)
        if self._progress is not None:
            self._progress.engine_ready(report.engine)
        if all(e.ready for e in self.engines.values()) and self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _engine_stats(self, name: str, stats: Any) -> None:
        engine = self.engines.get(name)
        if engine is not None:
            engine.stats = stats
        self.metrics.engine_stats(*self._labels(name), stats)

    def _labels(self, name: str) -> tuple[str, str]:
        """An engine's metric labels: (engine: its group, replica: its index there)."""
        slot = self._slots[name]
        return slot.group, str(slot.replica)

    def _admission_changed(self, running: int, waiting: int) -> None:
        self.metrics.running.set(running)
        self.metrics.api_waiting(waiting)

    # ---- shutdown --------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> None:
        """Graceful drain: refuse new requests (503), let the running ones finish for up to
        ``timeout_s``, then end each one left with an error (its stream gets the error event
        and its terminator) and give the streams a moment to flush."""
        self.draining = True
        self._drain_deadline = time.monotonic() + timeout_s
        log.info("draining: %d running request(s) may finish within %gs", self.admission.running, timeout_s)
        while self.admission.running and time.monotonic() < self._drain_deadline:
            await asyncio.sleep(0.05)
        left = list(self.router.streams)
        if left:
            log.warning("drain timeout: ending %d running request(s)", len(left))
            for rid in left:
                self.router.fail(rid, Finished("error", "the server is shutting down", 503, "server_shutting_down"))
            flush_deadline = time.monotonic() + 5.0
            while self.admission.running and time.monotonic() < flush_deadline:
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._closing = True
        for rid in list(self.router.streams):
            self.router.abort(rid)
        if self._receiver is not None:
            self._receiver.cancel()
            await asyncio.gather(self._receiver, return_exceptions=True)
            self._receiver = None
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    _closed = False

    def close(self) -> None:
        """Stop engines and the pool, remove sockets and leftover shared memory (sync,
        idempotent: also the launcher's last resort when the event loop is gone)."""
        if self._closed:
            return
        self._closed = self._closing = True
        self.supervisor.cancel()
        t0 = time.perf_counter()
        for engine in self.engines.values():
            engine.stop()
        t1 = time.perf_counter()
        self.preprocess.shutdown()
        log.info("stopped engines in %.2fs, preprocess pool in %.2fs", t1 - t0, time.perf_counter() - t1)
        if self._reports is not None:
            self._reports.close(linger=0)
        self.backend.close()
        self.zctx.destroy(linger=0)
        self.actx.destroy(linger=0)
        removed = cleanup_segments(self.shm_prefix)
        if removed:
            log.info("removed %d leftover shared-memory segment(s)", removed)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
