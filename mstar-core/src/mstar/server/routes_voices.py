"""``GET /v1/audio/voices``: the voices of the served model (from its adapter)."""

from __future__ import annotations

from typing import Any

from mstar.server.runtime import ServerRuntime


def voices(rt: ServerRuntime, model: str | None) -> dict[str, Any]:
    """One entry per voice, the default (the one a request without ``voice`` gets) first
    and marked; a model that speaks no voices lists none. ``model`` must be a name the
    server answers to (404 otherwise)."""
    if model is not None:
        rt.check_model(model)
    data = [
        {
            "object": "voice",
            "id": v.name,
            "name": v.name,
            "model": rt.model_name,
            "languages": list(v.languages),
            "description": v.description,
            "default": i == 0,
        }
        for i, v in enumerate(rt.adapter.voices())
    ]
    return {"object": "list", "data": data}
