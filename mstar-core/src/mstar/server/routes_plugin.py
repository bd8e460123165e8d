"""Mounting the routes plugins serve themselves (``ApiAdapter.routes()``, see
``mstar.api.routes``) and the ``RouteCall`` their handlers get."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from mstar.api.adapter import GENERATE, EngineRequest
from mstar.api.errors import ApiError
from mstar.api.routes import AdapterRoute
from mstar.api.tensors import concat_signal
from mstar.server.execution import Execution
from mstar.server.metrics import MODEL_SCOPE_KEY
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import ManagedStreamingResponse, abort_on_disconnect, ending_with_error


@dataclass
class Generation:
    """One engine request's outputs: every value of each signal, in order."""

    request_id: str
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    finish_reason: str | None = None
    seeds: dict[str, int] = field(default_factory=dict)

    def cat(self, signal: str) -> torch.Tensor:
        """The signal's values joined along dim 0 (empty when it produced none)."""
        return concat_signal(self.outputs.get(signal, []))


class RouteCall:
    """What a plugin route's handler gets: the HTTP ``request``, the model's ``adapter`` and
    served ``model_name``, and engine requests run like every core endpoint's."""

    def __init__(self, rt: ServerRuntime, request: Request) -> None:
        self.rt = rt
        self.request = request
        self.adapter = rt.adapter
        self.model_name = rt.model_name

    async def start(self, inputs: Mapping[str, Any], sampling: Mapping[str, Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, signals: list[str] | None = None) -> Execution:
        """Submit one engine request (admitted first; ``sampling`` in ``/v1/generate``'s
        native form, ``{node: {...}}``); a missing graph input is a 400."""
        missing = self.rt.graph.missing_inputs(inputs)
        if missing:
            raise ApiError(400, f"missing input(s) {missing}; this model takes {list(self.rt.graph.request_inputs)}")
        ex = Execution(self.rt, GENERATE, prefix="route")
        await ex.start(None, dict(sampling) if sampling is not None else None, signals,
                       prepared=EngineRequest(dict(inputs), dict(kwargs or {})))
        return ex

    async def generate(self, inputs: Mapping[str, Any], sampling: Mapping[str, Any] | None = None,
                       kwargs: Mapping[str, Any] | None = None, signals: list[str] | None = None) -> Generation:
        """Run one engine request to its end (aborted if the client leaves); raises
        ``ApiError`` when it fails."""
        ex = await self.start(inputs, sampling, kwargs, signals)
        out = Generation(ex.request_id, seeds=dict(ex.seeds))
        try:
            async with abort_on_disconnect(self.request.receive, ex.close):
                async for batch in ex.batches():
                    for signal, value in batch:
                        out.outputs.setdefault(signal, []).append(value)
        finally:
            ex.close()
        out.finish_reason = ex.finish_reason
        return out

    def streaming(self, ex: Execution, body: AsyncIterator[bytes], error_frames: Callable[[ApiError], Iterable[bytes]],
                  media_type: str) -> Response:
        """A streamed response over ``body`` (which reads ``ex.batches()``); the request is
        freed when the response ends in any way, and an error after the first byte is sent
        as ``error_frames(error)``."""
        return ManagedStreamingResponse(ending_with_error(body, ex, error_frames), ex.close, media_type=media_type,
                                        headers={"x-request-id": ex.request_id})


def adapter_routes(runtimes: list[ServerRuntime], taken: set[str]) -> list[tuple[AdapterRoute, ServerRuntime]]:
    """Every model's routes; a path core serves, or two models declaring one path and
    method, is a ``ValueError`` at start-up."""
    found: dict[tuple[str, str], ServerRuntime] = {}
    routes = []
    for rt in runtimes:
        for route in rt.adapter.routes():
            if route.path in taken:
                raise ValueError(f"model {rt.model_name!r}: route {route.path} is one of core's endpoints; pick another path")
            for method in route.methods:
                other = found.setdefault((method.upper(), route.path), rt)
                if other is not rt:
                    raise ValueError(f"models {other.model_name!r} and {rt.model_name!r} both serve {method} {route.path}")
            routes.append((route, rt))
    return routes


def install_adapter_routes(app: FastAPI, routes: list[tuple[AdapterRoute, ServerRuntime]]) -> None:
    for route, rt in routes:
        app.add_api_route(route.path, _endpoint(route, rt), methods=list(route.methods), include_in_schema=False)


def _endpoint(route: AdapterRoute, rt: ServerRuntime) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        request.scope[MODEL_SCOPE_KEY] = rt.model_name  # the request counter's model label
        answer = await route.handler(RouteCall(rt, request))
        if isinstance(answer, Response):
            return answer
        if isinstance(answer, str):
            return PlainTextResponse(answer)
        return JSONResponse(answer)

    return endpoint
