"""The models one server serves, by API name.

Each model is a ``ServerRuntime`` of its own: its engine processes, supervisor, admission
limits, preprocess pool and sockets. Nothing but the HTTP front end and the metrics
registry is shared, so one model's engine dying (and its supervised restart) leaves the
others serving. A request goes to the model its ``model`` field names; an unknown name is
a 404 listing the served ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mstar.api.adapter import CHAT, COMPLETIONS, GENERATE, SPEECH, TRANSCRIPTION, TRANSLATION
from mstar.api.errors import ApiError
from mstar.api.protocol import ModelCard
from mstar.server.metrics import MODEL_SCOPE_KEY, MetricFamilies
from mstar.server.middleware import HEALTH_DETAIL
from mstar.server.runtime import ServerRuntime

_ENDPOINTS = (CHAT, COMPLETIONS, SPEECH, TRANSCRIPTION, TRANSLATION, GENERATE)


class ModelSet:
    def __init__(self, runtimes: list[ServerRuntime]) -> None:
        if not runtimes:
            raise ValueError("a server needs at least one model")
        self.runtimes = runtimes
        self.by_name: dict[str, ServerRuntime] = {}
        for rt in runtimes:
            for name in sorted(rt.served_names()):
                other = self.by_name.setdefault(name, rt)
                if other is not rt:
                    raise ValueError(f"two models answer to {name!r} ({other.spec.name} and {rt.spec.name}); give each its own served names")
        families = {id(rt.metrics.families) for rt in runtimes}
        if len(families) != 1:
            raise ValueError("the models of one server must share one MetricFamilies (pass it to each ServerRuntime)")
        self.metrics: MetricFamilies = runtimes[0].metrics.families
        # Server-wide settings (host, port, API key, body limit, shutdown timeout) are the
        # same in every model's config; the first one's are read.
        self.config = runtimes[0].config

    # ---- routing ------------------------------------------------------------------------
    def get(self, name: str, scope: MutableMapping[str, Any] | None = None) -> ServerRuntime:
        """The runtime answering to ``name`` (404 otherwise); recorded in ``scope`` for
        the request counter's ``model`` label."""
        rt = self.by_name.get(name)
        if rt is None:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.describe_names()}", param="model", code="model_not_found")
        if scope is not None:
            scope[MODEL_SCOPE_KEY] = rt.model_name
        return rt

    def of_scope(self, scope: MutableMapping[str, Any]) -> ServerRuntime | None:
        """The runtime a request was routed to, if any."""
        name = scope.get(MODEL_SCOPE_KEY)
        return self.by_name.get(name) if name else None

    def describe_names(self) -> str:
        """``'toy', 'tts' (also 'speech')``: each model's API name and its aliases."""
        parts = []
        for rt in self.runtimes:
            aliases = aliases_of(rt)
            parts.append(repr(rt.model_name) + (f" (also {', '.join(map(repr, aliases))})" if aliases else ""))
        return ", ".join(parts)

    def first_serving(self, endpoint: str) -> ServerRuntime:
        """The first model that serves ``endpoint`` (the first model if none does)."""
        return next((rt for rt in self.runtimes if rt.adapter.serves(endpoint)), self.runtimes[0])

    # ---- listing ------------------------------------------------------------------------
    def cards(self) -> list[dict[str, Any]]:
        return [card(rt) for rt in self.runtimes]

    def version(self) -> dict[str, Any]:
        models = [
            {"model": rt.model_name, "plugin": rt.loaded.installed.distribution, "endpoints": endpoints(rt)}
            for rt in self.runtimes
        ]
        out: dict[str, Any] = {
            "plugin": ", ".join(dict.fromkeys(m["plugin"] for m in models)),
            "endpoints": sorted({e for m in models for e in m["endpoints"]}),
            "models": models,
        }
        if len(models) == 1:
            out["model"] = models[0]["model"]
        return out

    # ---- health -------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return all(rt.started for rt in self.runtimes)

    @property
    def draining(self) -> bool:
        return any(rt.draining for rt in self.runtimes)

    @property
    def healthy(self) -> bool:
        return all(rt.healthy for rt in self.runtimes)

    def retry_after_s(self) -> int:
        return max(rt.retry_after_s() for rt in self.runtimes)

    def health(self, model: str | None = None) -> tuple[int, dict[str, Any], int]:
        """``(status code, body, retry-after seconds)`` of ``GET /health``: one model's when
        ``model`` is given (or only one is served), else the server's: 200 while every model
        is healthy, 503 otherwise (``degraded`` while some still serve), each model's own
        report under ``models``."""
        if model is not None or len(self.runtimes) == 1:
            rt = self.get(model) if model is not None else self.runtimes[0]
            return (200 if rt.healthy else 503), _shown(rt.health()), rt.retry_after_s()
        if self.healthy:
            status = "ok"
        elif self.draining:
            status = "draining"
        else:
            status = "degraded" if any(rt.healthy for rt in self.runtimes) else "unhealthy"
        body = {"status": status, "models": {rt.model_name: _shown(rt.health()) for rt in self.runtimes}}
        return (200 if status == "ok" else 503), body, self.retry_after_s()

    # ---- life cycle ---------------------------------------------------------------------
    def set_stop_requested(self, stop: Callable[[], bool]) -> None:
        for rt in self.runtimes:
            rt.stop_requested = stop

    async def start(self, warm_up: Callable[[ServerRuntime], Awaitable[None]] | None = None) -> None:
        """Start every model at once; the first that fails stops the others' start-ups and
        its error is raised (the caller then closes all)."""
        tasks = [asyncio.create_task(rt.start(warm_up)) for rt in self.runtimes]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def drain(self, timeout_s: float) -> None:
        await asyncio.gather(*(rt.drain(timeout_s) for rt in self.runtimes))

    async def stop(self) -> None:
        await asyncio.gather(*(rt.stop() for rt in self.runtimes))

    def close(self) -> None:
        for rt in self.runtimes:
            rt.close()


def aliases_of(rt: ServerRuntime) -> list[str]:
    return sorted(rt.served_names() - {rt.model_name})


def endpoints(rt: ServerRuntime) -> list[str]:
    return sorted(e for e in _ENDPOINTS if rt.adapter.serves(e))


def chat_audio(rt: ServerRuntime) -> bool:
    """Whether the model's chat answers ``modalities: ["text", "audio"]`` (what the chat
    route accepts, so a client can offer it before asking)."""
    adapter = rt.adapter
    return adapter.serves(CHAT) and bool(adapter.chat_audio and adapter.audio_signal)


def card(rt: ServerRuntime) -> dict[str, Any]:
    """A ``/v1/models`` entry: OpenAI's model object plus the other names the model answers
    to, the endpoints it serves and whether its chat can answer in audio."""
    return {
        **ModelCard(id=rt.model_name, created=rt.created).model_dump(),
        "aliases": aliases_of(rt), "endpoints": endpoints(rt), "chat_audio": chat_audio(rt),
    }


# What /health shows of an engine only to a caller with the API key (when one is set):
# process ids and the text of its exits and errors.
_PRIVATE = ("pid", "error", "last_exit")


def _shown(report: dict[str, Any]) -> dict[str, Any]:
    if HEALTH_DETAIL.get():
        return report
    engines = {name: {k: v for k, v in e.items() if k not in _PRIVATE} for name, e in report.get("engines", {}).items()}
    return {**report, "engines": engines}
