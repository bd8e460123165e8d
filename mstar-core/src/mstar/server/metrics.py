"""Prometheus metrics of one server (its own registry, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mstar.server.messages import EngineStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mstar_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r)
        self.queue_depth = Gauge("mstar_queue_depth", "Requests waiting: for admission in the API process plus in the engines' queues", registry=r)
        self.running = Gauge("mstar_running_requests", "Requests admitted and in the engines", registry=r)
        self.batch_size = Gauge("mstar_running_batch_size", "Rows in the engine's latest forward", ["engine"], registry=r)
        self.kv_used = Gauge("mstar_kv_blocks_used", "KV-cache blocks in use", ["engine", "node"], registry=r)
        self.kv_total = Gauge("mstar_kv_blocks_total", "KV-cache blocks in the pool", ["engine", "node"], registry=r)
        self.preemptions = Gauge("mstar_engine_preemptions", "Requests preempted (KV cache taken back) since the engine started", ["engine"], registry=r)
        self.engine_up = Gauge("mstar_engine_up", "1 while the engine process is alive", ["engine"], registry=r)
        self.ttft = Histogram("mstar_time_to_first_token_seconds", "Arrival to first text token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("mstar_inter_token_latency_seconds", "Time between text deltas", buckets=_LATENCY_BUCKETS, registry=r)
        self.ttfa = Histogram("mstar_time_to_first_audio_seconds", "Arrival to first audio chunk", buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("mstar_real_time_factor", "Generation wall time / audio duration", buckets=_RTF_BUCKETS, registry=r)
        self.finished = Counter("mstar_request_finish", "Requests that left the engines, by finish reason (stop, length, abort, error)", ["reason"], registry=r)
        self.tokens = Counter("mstar_generated_tokens", "Text tokens generated", registry=r)
        self._engine_waiting: dict[str, int] = {}
        self._api_waiting = 0

    def engine_stats(self, engine: str, stats: EngineStats) -> None:
        self.batch_size.labels(engine).set(stats.batch_size)
        self.preemptions.labels(engine).set(stats.preemptions)
        for kv in stats.kv:
            self.kv_used.labels(engine, kv.node).set(kv.used_blocks)
            self.kv_total.labels(engine, kv.node).set(kv.total_blocks)
        self._engine_waiting[engine] = stats.waiting
        self._update_queue()

    def api_waiting(self, n: int) -> None:
        self._api_waiting = n
        self._update_queue()

    def _update_queue(self) -> None:
        self.queue_depth.set(self._api_waiting + sum(self._engine_waiting.values()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
