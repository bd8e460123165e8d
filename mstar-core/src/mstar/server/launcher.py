"""``mstar serve``: resolve the checkpoint, build the runtime, run uvicorn, clean up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mstar.server.config import ServerConfig

log = logging.getLogger("mstar.server")

RANDOM_WEIGHTS_BANNER = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!  --random-weights: model {model!r} runs on RANDOM weights from {path}
!!  Its output is NOISE. Use --weights DIR for a real checkpoint.
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


class ServeConfigError(Exception):
    """A mistake in the command line, checkpoint or placement (reported in one line)."""


def resolve_checkpoint(config: ServerConfig) -> Path:
    """The checkpoint directory to serve; ``config.model`` becomes the plugin's name.

    ``config.model`` may be a name or alias (weights from ``--weights`` or
    ``--random-weights``), or a checkpoint directory or Hub repo id, which is then the
    checkpoint too unless ``--weights`` names another."""
    from mstar.engine.engine import random_weights_dir
    from mstar.hub import checkpoint_dir
    from mstar.plugins.discovery import resolve_model
    from mstar.plugins.loading import load_model

    if config.weights and config.random_weights:
        raise ValueError("give either --weights DIR or --random-weights, not both")
    target = config.model
    installed = resolve_model(target, config.revision)
    config.model = installed.name
    names_model = target in (installed.name, *installed.aliases)
    if config.weights:
        return checkpoint_dir(config.weights, config.revision)
    if not names_model:
        if config.random_weights:
            raise ValueError(f"--random-weights serves the plugin's own tiny checkpoint; {target} is a checkpoint: drop one of them")
        return checkpoint_dir(target, config.revision)
    if not config.random_weights:
        raise ValueError("give --weights DIR (a checkpoint directory or Hugging Face repo id) or --random-weights")
    loaded = load_model(config.model)
    path = random_weights_dir(loaded.spec.name, loaded)
    banner = RANDOM_WEIGHTS_BANNER.format(model=loaded.spec.name, path=path)
    log.warning(banner)
    return path


def _exit_cleanly_on_signals() -> None:
    """SIGINT/SIGTERM end the process with status 0 once shut down. uvicorn handles them
    while it serves and re-raises them afterwards, into these handlers; before uvicorn
    runs (loading the model) they stop start-up at once."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _raise_open_files_limit() -> None:
    """The soft open-files limit up to the hard one: --max-connections, engines' sockets and
    shared memory all need descriptors (a 1,024 soft limit ran out under stalled clients)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16), hard))


def _draining_server_class() -> type:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """The first SIGTERM drains (``ServerRuntime.drain``) before uvicorn shuts down; a
        second signal, or SIGINT, shuts down at once."""

        def __init__(self, config: Any, runtime: Any) -> None:
            super().__init__(config)
            self.runtime = runtime
            self._drain_requested = False
            self._drain: asyncio.Task | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and not self._drain_requested and self.runtime.started and not self.should_exit:
                self._drain_requested = True  # picked up by on_tick on the event loop
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self._drain_requested and self._drain is None:
                self._drain = asyncio.ensure_future(self._drain_then_exit())
            return await super().on_tick(counter)

        async def _drain_then_exit(self) -> None:
            try:
                await self.runtime.drain(self.runtime.config.shutdown_timeout_s)
            finally:
                self.should_exit = True

    return DrainingServer


def _announcing(base: type, summary: Callable[[str], str]) -> type:
    """``base`` (a uvicorn server class) printing ``summary(url)`` once its port is bound."""

    class AnnouncingServer(base):
        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit:
                host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
                print(summary(f"http://{host}:{self.config.port}"), file=sys.stderr, flush=True)

    return AnnouncingServer


def _build_models(configs: list[ServerConfig]) -> Any:
    """A ``ModelSet`` of one runtime per config (sharing one metrics registry); the first
    bad checkpoint, placement or option is a ``ServeConfigError`` in one line."""
    from mstar.server.metrics import MetricFamilies
    from mstar.server.model_configs import with_sampling_defaults
    from mstar.server.model_set import ModelSet
    from mstar.server.runtime import ServerRuntime

    families = MetricFamilies()
    runtimes: list[ServerRuntime] = []
    try:
        for cfg in configs:
            model = cfg.model
            rt = ServerRuntime(cfg, resolve_checkpoint(cfg), families)
            runtimes.append(rt)
            rt.node_samplers = with_sampling_defaults(rt.node_samplers, rt.adapter.sampling_node, cfg.sampling_defaults)
        return ModelSet(runtimes)
    except (OSError, ValueError) as exc:
        for rt in runtimes:
            rt.close()
        if len(runtimes) == len(configs):  # every model loaded: their names clash
            raise ServeConfigError(str(exc)) from exc
        raise ServeConfigError(f"cannot serve {model!r}: {exc}") from exc


def run_server(config: ServerConfig, models: list[ServerConfig] | None = None) -> int:
    """Serve ``config``'s model, or each of ``models`` (one config per model, sharing
    ``config``'s host, port, API key and limits) behind one port."""
    import uvicorn

    from mstar.server.app import create_app
    from mstar.server.http_guard import guarded_h11
    from mstar.server.ready_summary import models_ready_summary

    DrainingServer = _announcing(_draining_server_class(), lambda url: models_ready_summary(runtime.runtimes, url))  # noqa: N806 (a class, built lazily with uvicorn)

    _exit_cleanly_on_signals()
    _raise_open_files_limit()
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    runtime = _build_models(models or [config])  # a ModelSet: starts, drains and stops them all
    app = create_app(runtime)
    server = DrainingServer(
        uvicorn.Config(
            app, host=config.host, port=config.port, log_level=config.log_level, timeout_graceful_shutdown=5, access_log=False,
            # h11 (not httptools): it bounds a request's headers; see mstar.server.http_guard.
            http=guarded_h11(config.header_timeout_s), h11_max_incomplete_event_size=config.max_header_bytes,
            limit_concurrency=config.max_connections,
        ),
        runtime,
    )
    runtime.set_stop_requested(lambda: server.should_exit)
    try:
        server.run()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        runtime.close()  # no-op after a clean lifespan shutdown; the last resort otherwise
    return 0 if runtime.started else 1
