"""``mstar.Engine``: the in-process API (the server runs this same class).

The step loop runs in one background thread; callers submit requests and read outputs
from per-request queues, synchronously (``generate``) or with asyncio
(``generate_async``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mstar.attention.cross import CROSS_STREAM
from mstar.engine.builder import BuiltModel, EngineConfig, build_core
from mstar.engine.lockstep import LockstepLeader, follow
from mstar.engine.request import Request, RequestOutput
from mstar.hub import checkpoint_dir
from mstar.plugins.loading import load_model
from mstar.sampling.resolve import resolve_sampling

log = logging.getLogger(__name__)


@dataclass
class RequestHandle:
    request_id: str
    seeds: dict[str, int]  # sampling node -> the request's main seed (reported to the caller)
    queue: Any = field(default=None, repr=False)


@dataclass
class CollectedOutput:
    """All events of one request, gathered: values per signal in order."""

    request_id: str
    signals: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    error_type: str | None = None
    seeds: dict[str, int] = field(default_factory=dict)

    def cat(self, signal: str) -> torch.Tensor:
        parts = [t.reshape(-1) if t.dim() == 0 else t for t in self.signals.get(signal, [])]
        return torch.cat(parts) if parts else torch.empty(0)


def random_weights_dir(model: str, loaded: Any, root: Path | None = None) -> Path:
    """Write (once) the plugin's tiny random checkpoint in its real layout and return it.

    The cache is keyed by the plugin's version and a digest of its package's source, so a
    changed checkpoint writer never serves a stale checkpoint.
    """
    root = root or Path.home() / ".cache" / "mstar" / "random-weights"
    path = root / f"{model}-{_plugin_digest(loaded)}"
    if not (path / ".complete").exists():
        path.mkdir(parents=True, exist_ok=True)
        loaded.spec.write_tiny_checkpoint(path)
        (path / ".complete").touch()
    return path


def _plugin_digest(loaded: Any) -> str:
    import hashlib
    import inspect
    import sys

    h = hashlib.blake2b(digest_size=8)
    h.update(str(getattr(getattr(loaded, "installed", None), "version", "")).encode())
    plugin = getattr(loaded, "plugin", None)
    module = plugin if inspect.ismodule(plugin) else sys.modules.get(type(plugin).__module__)
    file = getattr(module, "__file__", None)
    if file:
        for src in sorted(Path(file).parent.rglob("*.py")):
            h.update(src.read_bytes())
    return h.hexdigest()


class Engine:
    def __init__(self, built: BuiltModel, loaded: Any, checkpoint_dir: Path) -> None:
        self.built = built
        self.loaded = loaded
        self.checkpoint_dir = checkpoint_dir
        self.core = built.core
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._queues: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.fatal_error: str | None = None
        self._step_listeners: list[Any] = []
        self._requests_added = 0  # for stats(): what this engine was given
        self._inbox: list[Any] = []  # commands waiting for the loop (see _submit)
        self._inbox_lock = threading.Lock()
        # Tensor parallelism: rank 0 tells the other ranks' engines what it applies and when
        # it steps (mstar.engine.lockstep); they run ``follow`` instead of taking requests.
        tp = self.core.tensor_parallel
        self._leader = LockstepLeader(tp) if tp is not None and tp.rank == 0 else None

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def from_model(
        cls,
        model: str,
        weights: str | Path | None = None,
        random_weights: bool = False,
        revision: str | None = None,
        **engine_kwargs: Any,
    ) -> Engine:
        """``model``: a name, alias, checkpoint directory or Hugging Face repo id;
        ``weights``: a checkpoint directory or repo id (default: ``model`` itself when it is
        one); ``revision``: of a repo id."""
        loaded = load_model(model, revision)
        names_model = str(model) in (loaded.installed.name, *loaded.installed.aliases)
        if weights is None and not random_weights and not names_model:
            weights = model
        if weights is None and not random_weights:
            raise ValueError("give weights=<checkpoint dir or repo id> or random_weights=True")
        ckpt = checkpoint_dir(weights, revision) if weights is not None else random_weights_dir(loaded.spec.name, loaded)
        if random_weights:
            log.warning("model %s runs on RANDOM weights: its output is noise", loaded.spec.name)
        config = EngineConfig(**{**loaded.spec.engine_defaults, **engine_kwargs})  # the caller's options win
        return cls(build_core(loaded, ckpt, config), loaded, ckpt)

    @property
    def model_name(self) -> str:
        return self.built.spec.name

    # ---- requests -------------------------------------------------------------------
    def make_sampling(self, sampling: Mapping[str, Any] | None) -> dict[str, Any]:
        """Per sampling node: the plugin defaults overridden by the request's values, labels
        validated, seeds resolved (``mstar.sampling.resolve``). ``sampling`` maps node ->
        {"main": {...}, "aux": {label: {...}}} or a plain params dict for the main sampler; a
        single-sampler model also accepts that directly."""
        return resolve_sampling(self.built.node_samplers, sampling)[0]

    def add_request(
        self,
        inputs: Mapping[str, torch.Tensor],
        sampling: Mapping[str, Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        priority: int = 0,
        _sink: Any = None,
    ) -> RequestHandle:
        req, handle = self._new_request(inputs, sampling, kwargs, request_id, priority, _sink)
        self._requests_added += 1
        self._submit(lambda: self._apply("add_request", req))
        self._ensure_thread()
        return handle

    def _new_request(
        self,
        inputs: Mapping[str, torch.Tensor],
        sampling: Mapping[str, Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        priority: int = 0,
        _sink: Any = None,
    ) -> tuple[Request, RequestHandle]:
        """Validate a request and register its output sink (caller's thread)."""
        if self.fatal_error:
            raise RuntimeError(f"engine is down: {self.fatal_error}")
        rid = request_id or uuid.uuid4().hex
        missing = self.built.graph.missing_inputs(inputs)
        if missing:
            raise ValueError(f"missing request input(s) {missing}")
        configs = self.make_sampling(sampling)
        req = Request(
            id=rid,
            inputs={k: torch.as_tensor(v) for k, v in inputs.items()},
            kwargs=dict(kwargs or {}),
            sampling=configs,
            arrival=0,
            priority=priority,
        )
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already running")
        sink = _sink if _sink is not None else queue.SimpleQueue()
        self._queues[rid] = sink
        return req, RequestHandle(rid, {node: cfg.main.seed for node, cfg in configs.items()}, sink)

    def stats(self) -> dict[str, Any]:
        """A consistent snapshot for metrics, safe to call from any thread."""
        with self._lock:
            core = self.core
            return {
                "waiting": len(core.waiting),
                "running": len(core.running),
                "steps": core.stats.steps,
                "preemptions": core.stats.preemptions,
                "requests": self._requests_added,
                "last_batch_size": core.stats.last_batch_size,
                "kv": {name: _kv_stats(n) for name, n in core.nodes.items() if n.kv is not None},
                "output_cache": {
                    name: {"entries": len(c), "bytes": c.bytes, "hits": c.hits, "misses": c.misses, "evictions": c.evictions}
                    for name, n in core.nodes.items() if (c := n.output_cache) is not None
                },
            }

    def stats_requests(self) -> int:
        """Requests added since the engine started (no lock: a counter read)."""
        return self._requests_added

    def add_step_listener(self, fn: Any) -> None:
        """``fn()`` runs on the engine thread after each step's outputs were handed out,
        so a transport can send one message per step."""
        self._step_listeners.append(fn)

    def _submit(self, command: Any) -> None:
        """Run ``command`` on the core now if it is free, else queue it for the loop.

        The loop holds the core's lock for a whole step and takes it again at once, so a
        caller blocking on that lock can starve for many steps (requests then arrive one by
        one). Commands keep their order: once one is queued, the rest queue behind it.
        """
        with self._inbox_lock:
            if not self._inbox and self._lock.acquire(blocking=False):
                try:
                    command()
                finally:
                    self._lock.release()
            else:
                self._inbox.append(command)
        self._wake.set()

    def _apply(self, command: str, *args: Any) -> None:
        """Run a core command (add_request, abort, push_stream, close_stream); with tensor
        parallelism, also recorded for the other ranks."""
        if self._leader is not None:
            self._leader.record(command, *args)
        getattr(self.core, command)(*args)

    def follow(self) -> int:
        """Tensor-parallel ranks other than 0: step as rank 0 does until it closes (returns
        the forwards run). Blocks; this engine takes no requests of its own."""
        tp = self.core.tensor_parallel
        if tp is None or tp.rank == 0:
            raise RuntimeError("follow() is for tensor-parallel ranks other than 0")
        before = torch.get_num_threads()
        if self.core.forward_threads is not None:
            torch.set_num_threads(self.core.forward_threads)
        try:
            return follow(self.core, tp)
        finally:
            torch.set_num_threads(before)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            commands, self._inbox = self._inbox, []
        for command in commands:
            command()

    def push_stream(self, request_id: str, signal: str, value: torch.Tensor) -> None:
        """Feed an item of a stream produced by another engine process."""
        self._submit(lambda: self._apply("push_stream", request_id, signal, value))

    def close_stream(self, request_id: str, signal: str) -> None:
        self._submit(lambda: self._apply("close_stream", request_id, signal))

    def abort(self, request_id: str) -> None:
        self._submit(lambda: self._apply("abort", request_id))

    def generate(self, inputs: Mapping[str, torch.Tensor], sampling: Mapping[str, Any] | None = None, **kw: Any) -> Iterator[RequestOutput]:
        handle = self.add_request(inputs, sampling, **kw)
        q = handle.queue
        while True:
            out: RequestOutput = q.get()
            yield out
            if out.finished:
                return

    async def generate_async(
        self, inputs: Mapping[str, torch.Tensor], sampling: Mapping[str, Any] | None = None, **kw: Any
    ) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        aq: asyncio.Queue[RequestOutput] = asyncio.Queue()
        sink = _AsyncSink(loop, aq)
        handle = self.add_request(inputs, sampling, _sink=sink, **kw)
        try:
            while True:
                out = await aq.get()
                yield out
                if out.finished:
                    return
        finally:
            if not sink.finished:
                self.abort(handle.request_id)

    def run_batch(self, requests: list[dict[str, Any]]) -> list[CollectedOutput]:
        """Submit all requests at once (each a dict of ``add_request`` arguments) and wait.
        While no loop thread runs (the first ``add_request`` or ``generate`` starts it, and it
        runs until ``close``), the steps run on the calling thread (``_drive``)."""
        made = [self._new_request(**r) for r in requests]
        handles = [h for _, h in made]

        def add_all() -> None:  # one command: the engine sees them together, every run
            for req, _ in made:
                self._apply("add_request", req)

        self._submit(add_all)
        if self._thread is None or not self._thread.is_alive():
            self._drive({h.request_id for h in handles})  # nothing else steps: this thread does
        else:
            self._ensure_thread()
        results = []
        for h in handles:
            col = CollectedOutput(h.request_id, seeds=h.seeds)
            q = h.queue
            while True:
                out: RequestOutput = q.get()
                if out.signal is not None and out.data is not None and not out.stream_item:
                    col.signals.setdefault(out.signal, []).append(out.data)
                if out.finished:
                    col.finish_reason, col.error, col.error_type = out.finish_reason, out.error, out.error_type
                    break
            results.append(col)
        return results

    # ---- the loop thread ------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="mstar-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        self.core.pin_thread()
        while not self._closed:
            busy, outputs = self._step_once()
            if not busy or (self.core.idle and not outputs):
                # Nothing to do until a command arrives (requests waiting on a stream from
                # another process must not spin and starve the other threads).
                self._wake.wait(0.05 if not busy else 0.005)
                self._wake.clear()

    def _step_once(self) -> tuple[bool, list[RequestOutput]]:
        """Take the queued commands, run one step if there is work, hand its outputs to
        their queues; (whether there was work, the outputs). Any thread may call it: the
        lock keeps steps one at a time."""
        with self._lock:
            self._drain_inbox()
            busy = self.core.has_work()
            try:
                if self._leader is not None:  # a dead follower fails this: the engine's failure
                    self._leader.before_step(busy)
                outputs = self.core.step() if busy else []
            except Exception as exc:  # an engine bug: fail everything in flight, loudly
                log.exception("engine step failed")
                self.fatal_error = f"{type(exc).__name__}: {exc}"
                outputs = [
                    RequestOutput(rid, finished=True, finish_reason="error", error=self.fatal_error, error_type="internal")
                    for rid in self._queues
                ]
                self._closed = True
            for out in outputs:
                q = self._queues.get(out.request_id)
                if q is not None:
                    try:
                        q.put(out)
                    except Exception:  # a consumer that went away must not stop the loop
                        log.debug("dropping output for %s", out.request_id, exc_info=True)
                        self._apply("abort", out.request_id)
                if out.finished:
                    self._queues.pop(out.request_id, None)
            if outputs:
                for fn in self._step_listeners:
                    fn()
        return busy, outputs

    def _drive(self, request_ids: set[str]) -> None:
        """Step on the calling thread until ``request_ids`` have finished (``run_batch``
        with no loop thread running), with the engine's torch threads for the time.

        Why not hand the steps to the loop thread: OpenMP (libgomp) gives every thread that
        starts parallel regions its own pool, and once two exist (this thread's, e.g. from
        loading the model, and the loop's) it stops its workers spinning between regions,
        so each region waits for a woken thread: measured 0.28 against 0.15 ms for a
        [20, 512] x [512, 2048] packed matmul with 2 threads on a 2-core host, and the
        Llama workload of ``benchmarks/engine_vs_transformers.py`` 13.6-13.7 s stepped from
        a second thread against 11.3 s from the thread that loaded it."""
        before = torch.get_num_threads()
        if self.core.forward_threads is not None:
            torch.set_num_threads(self.core.forward_threads)
        try:
            while not self._closed and any(rid in self._queues for rid in request_ids):
                busy, outputs = self._step_once()
                if not busy or (self.core.idle and not outputs):
                    self._wake.wait(0.005)
                    self._wake.clear()
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._leader is not None:
            if not self.fatal_error:  # after a failed collective the other ranks may be gone
                self._leader.stop()
            self._leader = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncSink:
    """Delivers outputs from the engine thread into an asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, aq: asyncio.Queue) -> None:
        self.loop = loop
        self.aq = aq
        self.finished = False

    def put(self, out: RequestOutput) -> None:
        if out.finished:
            self.finished = True
        if self.loop.is_closed():
            raise RuntimeError("the consumer's event loop is closed")
        self.loop.call_soon_threadsafe(self.aq.put_nowait, out)


def _kv_stats(node: Any) -> dict[str, int]:
    kv = node.kv
    out = {"used_blocks": kv.num_used_blocks, "total_blocks": kv.num_blocks, "block_bytes": kv.block_bytes}
    if node.cross_signal is not None:  # encoder–decoder: cross-attention caches share the pool
        out["cross_blocks"] = kv.num_stream_blocks(CROSS_STREAM)
    cache = kv.prefix_cache
    if cache is not None:
        out.update(cached_blocks=cache.num_cached, prefix_queried_tokens=cache.queried_tokens,
                   prefix_hit_tokens=cache.hit_tokens, prefix_evictions=cache.evictions)
    return out
