"""Request bodies are standard JSON: ``NaN``, ``Infinity`` and ``-Infinity`` (which
Python's parser accepts) are rejected as invalid JSON, as is nesting too deep to parse, so
no non-finite number reaches a sampling field or an engine input.

Valid JSON that no request may carry is a 400 naming the field (``UnsafeValue``): a lone
UTF-16 surrogate in a string or a key (``"\\ud800"``: no character, and no UTF-8 encoder,
ours or an engine's, takes it), containers nested more than ``MAX_DEPTH`` deep, and a
number beyond a float's range (``1e999``, which Python reads as infinity)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from mstar.api.errors import ApiError

MAX_DEPTH = 64  # objects and arrays nested in one body; OpenAI's deepest shapes need about 10

# What may hold a lone surrogate: its JSON escape, or its bytes (Python's parser reads
# UTF-8 with "surrogatepass"). A body without either never holds one.
_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class UnsafeValue(json.JSONDecodeError):
    """Valid JSON that no request may carry; ``param`` names the field (None: the body)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message, "", 0)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


class _Overflow(float):
    """A JSON number beyond a float's range, as parsed (found and reported by the walk)."""

    text: str


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _float(text: str) -> float:
    value = float(text)
    if math.isfinite(value):
        return value
    marked = _Overflow(value)
    marked.text = text
    return marked


def loads_strict(body: bytes) -> Any:
    overflow = False

    def parse_float(text: str) -> float:
        nonlocal overflow
        value = _float(text)
        overflow = overflow or isinstance(value, _Overflow)
        return value

    try:
        doc = json.loads(body, parse_constant=_no_constant, parse_float=parse_float)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        text = body.decode("utf-8", errors="replace")
        raise json.JSONDecodeError(f"{exc} is not a JSON number", text, 0) from None
    except RecursionError:
        raise UnsafeValue(f"the body is nested more than {MAX_DEPTH} deep", None) from None
    deep = body.count(b"[") + body.count(b"{") > MAX_DEPTH
    if deep or overflow or _SURROGATE_BYTES.search(body):
        _check(doc)
    return doc


def _name(key: object) -> str:
    # A key may hold the very surrogate reported: shown escaped, so the answer encodes.
    return str(key).encode("utf-8", "backslashreplace").decode()


def _param(path: tuple[object, ...]) -> str | None:
    return ".".join(_name(p) for p in path) or None


def _check(doc: Any) -> None:
    """Raise ``UnsafeValue`` for the first unsafe value in ``doc`` (depth first)."""
    stack: list[tuple[Any, tuple[object, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                where = _param(path)
                raise UnsafeValue(f"{where or 'the body'}: a lone UTF-16 surrogate ({_name(found.group())}) is not a "
                                  "character; strings must be valid Unicode", where)
        elif isinstance(value, _Overflow):
            where = _param(path)
            raise UnsafeValue(f"{where or 'the body'}: the number {value.text} is beyond the range of a float", where)
        elif isinstance(value, dict | list):
            if len(path) >= MAX_DEPTH:
                where = _param(path[:1])  # the field holding it
                raise UnsafeValue(f"{where}: objects and arrays nested more than {MAX_DEPTH} deep", where)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and _SURROGATE.search(key):
                    where = _param(path)
                    raise UnsafeValue(f"{where or 'the body'}: the key '{_name(key)}' holds a lone UTF-16 surrogate, "
                                      "which is not a character; keys must be valid Unicode", where)
                if isinstance(item, str | dict | list | _Overflow):  # other numbers, booleans and null are safe
                    stack.append((item, (*path, key)))


class _Unsafe(HTTPException):
    # An HTTPException so FastAPI's body reader re-raises it (instead of calling it a
    # generic JSON error); the route turns it into its 400.
    def __init__(self, error: UnsafeValue) -> None:
        super().__init__(400, error.message)
        self.error = error


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = loads_strict(await self.body())
            except UnsafeValue as exc:
                raise _Unsafe(exc) from None
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(StrictJSONRequest(request.scope, request.receive))
            except _Unsafe as exc:
                raise ApiError(400, exc.error.message, param=exc.error.param, code="invalid_value") from None

        return route
