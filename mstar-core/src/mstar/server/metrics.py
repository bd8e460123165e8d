"""Prometheus metrics of one server (its own registry, so tests can run several).

Every ``mstar_*`` family has ``model`` as its first label: a server may serve several
models, each with its own engines, queues and latencies. ``MetricFamilies`` owns the
registry; ``ServerMetrics`` is one model's view of it, with the label filled in. HTTP
request counts carry the model the route served (``""`` for requests that reached none:
/health, /metrics, auth failures, unknown models)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mstar.server.messages import EngineStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
# The ASGI scope key where a route records the model it served, for the request counter.
MODEL_SCOPE_KEY = "mstar.model"


class MetricFamilies:
    """The server's registry and every ``mstar_*`` family, each labelled by ``model`` first."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        m = ["model"]
        self.requests = Counter("mstar_requests", "HTTP requests by endpoint and status code", [*m, "endpoint", "status"], registry=r)
        self.queue_depth = Gauge("mstar_queue_depth", "Requests waiting: for admission in the API process plus in the engines' queues", m, registry=r)
        self.running = Gauge("mstar_running_requests", "Requests admitted and in the engines", m, registry=r)
        # Per engine process: ``engine`` is its placement group, ``replica`` its index there.
        e = [*m, "engine", "replica"]
        self.batch_size = Gauge("mstar_running_batch_size", "Rows in the engine's latest forward", e, registry=r)
        self.kv_used = Gauge("mstar_kv_blocks_used", "KV-cache blocks in use", [*e, "node"], registry=r)
        self.kv_total = Gauge("mstar_kv_blocks_total", "KV-cache blocks in the pool", [*e, "node"], registry=r)
        self.kv_cached = Gauge("mstar_prefix_cache_blocks", "KV-cache blocks in the prefix index (held or evictable)", [*e, "node"], registry=r)
        self.prefix_queried = Gauge("mstar_prefix_cache_queried_tokens", "Prompt positions looked up in the prefix cache since the engine started", [*e, "node"], registry=r)
        self.prefix_hits = Gauge("mstar_prefix_cache_hit_tokens", "Prompt positions found in the prefix cache (not computed) since the engine started", [*e, "node"], registry=r)
        self.prefix_evictions = Gauge("mstar_prefix_cache_evictions", "Cached blocks evicted for space since the engine started", [*e, "node"], registry=r)
        self.output_cache_hits = Gauge("mstar_output_cache_hits", "Rows of a stateless node (e.g. a media encoder) served from its output cache since the engine started", [*e, "node"], registry=r)
        self.output_cache_misses = Gauge("mstar_output_cache_misses", "Rows of a stateless node with an output cache that were computed since the engine started", [*e, "node"], registry=r)
        self.output_cache_bytes = Gauge("mstar_output_cache_bytes", "Host memory held by a stateless node's output cache", [*e, "node"], registry=r)
        self.kv_cross_bytes = Gauge("mstar_kv_cross_attention_bytes", "KV-cache bytes held by cross-attention caches (encoder–decoder nodes; part of the blocks in use)", [*e, "node"], registry=r)
        self.preemptions = Gauge("mstar_engine_preemptions", "Requests preempted (KV cache taken back) since the engine started", e, registry=r)
        self.engine_up = Gauge("mstar_engine_up", "1 while the engine process is alive", e, registry=r)
        self.engine_requests = Gauge("mstar_engine_requests", "Requests the engine process took in since it started", e, registry=r)
        self.ttft = Histogram("mstar_time_to_first_token_seconds", "Arrival to first text token", m, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("mstar_inter_token_latency_seconds", "Time between text deltas", m, buckets=_LATENCY_BUCKETS, registry=r)
        self.ttfa = Histogram("mstar_time_to_first_audio_seconds", "Arrival to first audio chunk", m, buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("mstar_real_time_factor", "Generation wall time / audio duration", m, buckets=_RTF_BUCKETS, registry=r)
        self.finished = Counter("mstar_request_finish", "Requests that left the engines, by finish reason (stop, length, abort, error)", [*m, "reason"], registry=r)
        self.tokens = Counter("mstar_generated_tokens", "Text tokens generated", m, registry=r)

    def count_request(self, model: str, endpoint: str, status: int | str) -> None:
        self.requests.labels(model, endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ForModel:
    """A family with more labels than ``model``, seen from one model: ``labels(...)`` takes
    the other labels."""

    def __init__(self, family: Any, model: str) -> None:
        self._family = family
        self._model = model

    def labels(self, *values: str) -> Any:
        return self._family.labels(self._model, *values)


class ServerMetrics:
    """One model's metrics (``model``: its API name) in ``families`` (a new registry of its
    own when not given)."""

    def __init__(self, model: str = "", families: MetricFamilies | None = None) -> None:
        f = self.families = families if families is not None else MetricFamilies()
        self.model = model
        self.registry = f.registry
        self.requests = _ForModel(f.requests, model)
        self.queue_depth = f.queue_depth.labels(model)
        self.running = f.running.labels(model)
        self.batch_size = _ForModel(f.batch_size, model)
        self.kv_used = _ForModel(f.kv_used, model)
        self.kv_total = _ForModel(f.kv_total, model)
        self.kv_cached = _ForModel(f.kv_cached, model)
        self.kv_cross_bytes = _ForModel(f.kv_cross_bytes, model)
        self.prefix_queried = _ForModel(f.prefix_queried, model)
        self.prefix_hits = _ForModel(f.prefix_hits, model)
        self.prefix_evictions = _ForModel(f.prefix_evictions, model)
        self.output_cache_hits = _ForModel(f.output_cache_hits, model)
        self.output_cache_misses = _ForModel(f.output_cache_misses, model)
        self.output_cache_bytes = _ForModel(f.output_cache_bytes, model)
        self.preemptions = _ForModel(f.preemptions, model)
        self.engine_up = _ForModel(f.engine_up, model)
        self.engine_requests = _ForModel(f.engine_requests, model)
        self.ttft = f.ttft.labels(model)
        self.itl = f.itl.labels(model)
        self.ttfa = f.ttfa.labels(model)
        self.rtf = f.rtf.labels(model)
        self.finished = _ForModel(f.finished, model)
        self.tokens = f.tokens.labels(model)
        self._engine_waiting: dict[str, int] = {}
        self._api_waiting = 0

    def engine_stats(self, engine: str, replica: str, stats: EngineStats) -> None:
        """``engine``: the process's placement group; ``replica``: its index there."""
        self.batch_size.labels(engine, replica).set(stats.batch_size)
        self.preemptions.labels(engine, replica).set(stats.preemptions)
        self.engine_requests.labels(engine, replica).set(stats.requests)
        for kv in stats.kv:
            self.kv_used.labels(engine, replica, kv.node).set(kv.used_blocks)
            self.kv_total.labels(engine, replica, kv.node).set(kv.total_blocks)
            self.kv_cached.labels(engine, replica, kv.node).set(kv.cached_blocks)
            self.prefix_queried.labels(engine, replica, kv.node).set(kv.prefix_queried_tokens)
            self.prefix_hits.labels(engine, replica, kv.node).set(kv.prefix_hit_tokens)
            self.prefix_evictions.labels(engine, replica, kv.node).set(kv.prefix_evictions)
            if kv.cross_blocks >= 0:
                self.kv_cross_bytes.labels(engine, replica, kv.node).set(kv.cross_blocks * kv.block_bytes)
        for c in stats.output_cache:
            self.output_cache_hits.labels(engine, replica, c.node).set(c.hits)
            self.output_cache_misses.labels(engine, replica, c.node).set(c.misses)
            self.output_cache_bytes.labels(engine, replica, c.node).set(c.bytes)
        self._engine_waiting[f"{engine}/{replica}"] = stats.waiting
        self._update_queue()

    def api_waiting(self, n: int) -> None:
        self._api_waiting = n
        self._update_queue()

    def _update_queue(self) -> None:
        self.queue_depth.set(self._api_waiting + sum(self._engine_waiting.values()))

    def render(self) -> bytes:
        return self.families.render()
