"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

# OpenAI's error ``type`` for each status we answer with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error the API answers with; ``status`` is the HTTP status code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def __reduce__(self) -> Any:
        # Picklable, so an error raised in a preprocess worker keeps its status and param.
        return (_rebuild, (self.status, self.message, self.param, self.code, self.type))

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def _rebuild(status: int, message: str, param: str | None, code: str | None, type: str) -> ApiError:
    return ApiError(status, message, param=param, code=code, type=type)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def loc_to_param(loc: tuple[Any, ...] | list[Any], prefix: str = "") -> str | None:
    """pydantic's error location as a dotted parameter name (``messages.0.content``)."""
    parts = [str(p) for p in loc if p not in ("body", "__root__")]
    # Union members show up as type names in the location; they are no parameter.
    parts = [p for p in parts if not p.startswith(("function-", "literal[", "tagged-union["))]
    name = ".".join(parts)
    return f"{prefix}{name}" if name else (prefix.rstrip(".") or None)


def validation_error(exc: ValidationError | list[dict[str, Any]], prefix: str = "") -> ApiError:
    """The first pydantic error as a 400 naming its field; the others follow in the message."""
    errors = exc.errors() if isinstance(exc, ValidationError) else exc
    if not errors:
        return ApiError(400, "invalid request")
    first = errors[0]
    param = loc_to_param(first.get("loc", ()), prefix)
    if first.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", code="invalid_json")
    messages = []
    for err in errors[:5]:
        where = loc_to_param(err.get("loc", ()), prefix)
        messages.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return ApiError(400, "; ".join(messages) + more, param=param, code="invalid_value")
