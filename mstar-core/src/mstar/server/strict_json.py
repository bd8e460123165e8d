"""Request bodies are standard JSON: ``NaN``, ``Infinity`` and ``-Infinity`` (which
Python's parser accepts) are rejected as invalid JSON, as is nesting too deep to parse, so
no non-finite number reaches a sampling field or an engine input."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def loads_strict(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_no_constant)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        doc = body.decode("utf-8", errors="replace")
        raise json.JSONDecodeError(f"{exc} is not a JSON number", doc, 0) from None
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return route
