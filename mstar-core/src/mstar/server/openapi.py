"""The OpenAPI schema declares the statuses the server really returns: FastAPI's default
422 becomes 400 (invalid input is a 400 here), and every endpoint that takes a body lists
the errors it can answer with, all in OpenAI's error shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

BODY_ERRORS = {
    "400": "Invalid JSON, types or values; `param` names the field",
    "404": "Unknown model",
    "413": "Body over --max-body-bytes",
    "429": "Queue full (Retry-After)",
    "500": "Server fault",
    "503": "Engine restarting or down, or the server is draining (Retry-After)",
    "504": "--request-timeout exceeded",
}


def install_openapi(app: FastAPI, api_key: bool) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
            error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for item in schema.get("paths", {}).values():
                for op in item.values():
                    responses = op.setdefault("responses", {})
                    responses.pop("422", None)
                    codes = dict(BODY_ERRORS) if "requestBody" in op else {}
                    if api_key:
                        codes["401"] = "Missing or wrong API key"
                    for status, description in codes.items():
                        responses.setdefault(status, {"description": description, **error})
            for name in ("HTTPValidationError", "ValidationError"):
                schema["components"]["schemas"].pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
