"""Endpoints a plugin serves itself (``ApiAdapter.routes()``), for what no core endpoint
expresses.

    from mstar.api.routes import AdapterRoute

    class MyAdapter(ApiAdapter):
        def routes(self):
            return [AdapterRoute("/v1/my-model/score", self.score)]

        async def score(self, call):                  # call: mstar.server.routes_plugin.RouteCall
            body = await call.request.json()
            out = await call.generate({"prompt_ids": [1, 2, 3]}, sampling={"lm": {"max_tokens": 4}})
            return {"tokens": out.cat("token").tolist(), "finish_reason": out.finish_reason}

The server mounts each route beside its own: the API key, body limit, draining and request
metrics (``endpoint`` label: the route's path) apply as to every route, an ``ApiError`` (or
any other exception, as a 500) is answered in OpenAI's error shape, and each engine request
goes through the model's admission queue, request timeout and abort on disconnect
(``RouteCall``). A handler returns a Starlette ``Response``, a dict (sent as JSON) or a str
(plain text). It runs on the API process's event loop: do heavy work (media decoding) with
``await asyncio.to_thread(...)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AdapterRoute:
    """``path`` (e.g. ``/v1/my-model/score``; may not be one of core's), the ``handler``
    called as ``await handler(call)`` and the HTTP ``methods`` it answers."""

    path: str
    handler: Callable[[Any], Awaitable[Any]]
    methods: tuple[str, ...] = ("POST",)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"AdapterRoute path {self.path!r} must start with '/'")
