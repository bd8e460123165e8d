"""Settings of one ``mstar serve`` instance."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mstar.server.tensor_codec import DEFAULT_SHM_THRESHOLD


@dataclass
class ServerConfig:
    model: str  # as given: name, alias, checkpoint directory or Hub repo id (the launcher resolves it)
    weights: str | None = None  # checkpoint directory or Hub repo id
    revision: str | None = None  # of a Hub repo id
    served_model_names: list[str] = field(default_factory=list)  # API names; empty: name + aliases
    random_weights: bool = False
    placement: str | None = None  # path of a placement YAML
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_concurrency: int = 64
    max_queue: int = 512
    request_timeout_s: float = 600.0
    # A /v1/realtime session with no client event and no response running this long is closed.
    realtime_idle_s: float = field(default_factory=lambda: float(os.environ.get("MSTAR_REALTIME_IDLE_S", "600")))
    max_body_bytes: int = 32 << 20
    log_level: str = "info"
    device: str = "cpu"
    preprocess_workers: int = field(default_factory=lambda: max(1, min(4, (os.cpu_count() or 2) // 2)))
    shm_threshold: int = DEFAULT_SHM_THRESHOLD
    engine_threads: int | None = None  # torch intra-op threads per engine process
    engine_options: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields
    startup_timeout_s: float = 600.0
    restart_engines: bool = True  # a dead engine process is restarted (with back-off)
    max_engine_restarts: int = 5  # per engine within engine_restart_window_s; more: it stays down
    engine_restart_window_s: float = 600.0  # the restart limit's window (0: over the server's life)
    max_header_bytes: int = 64 << 10  # a request's line and headers, larger: 400 and closed
    header_timeout_s: float = 10.0  # for a request's headers (and an idle or unread connection after a response)
    body_timeout_s: float = 60.0  # for a request's whole body, from its headers; slower: 408 and closed
    max_connections: int = 1024  # open HTTP connections; a request beyond them gets 503
    shutdown_timeout_s: float = 30.0  # SIGTERM: how long running requests may still finish
    max_stream_buffer_bytes: int = 64 << 20  # output waiting for a slow reader, per request
    max_stream_buffer_total_bytes: int = 256 << 20  # the same over all requests; beyond: the slowest reader is aborted
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # the sampling node's defaults (a --models-config entry's sampling)
    placement_backend: str = "local"  # engines as local processes, or "ray": Ray actors
    ray_address: str | None = None  # the Ray cluster to join (None: Ray's default)
    voices_dir: str | None = None  # saved voices; None: $MSTAR_VOICES_DIR or <user cache>/mstar/voices
    voice_max_bytes: int = 10 << 20  # a reference clip's file, larger: 413
    voice_max_seconds: float = 30.0  # a reference clip's duration, longer: 400
