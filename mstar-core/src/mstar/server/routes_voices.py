"""``/v1/audio/voices``: list a model's voices (built in and saved), make a saved voice from
a reference clip (``POST``), remove one (``DELETE /v1/audio/voices/{name}``).

Making a voice runs the adapter's ``voice_tensors`` once, in the preprocess pool (the clip
is decoded there too), and, when it returns an ``EngineVoice``, that engine request; the
result goes to the model's ``VoiceLibrary``; a speech request then names it as its ``voice``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse

from mstar.api.adapter import VOICE
from mstar.api.errors import ApiError
from mstar.api.voices import EngineVoice, VoiceUpload
from mstar.server.preprocess import voice_from_request
from mstar.server.runtime import ServerRuntime
from mstar.server.strict_json import UnsafeValue, loads_strict
from mstar.server.voice_library import check_name
from mstar.server.voice_making import engine_voice_tensors

# How the app finds a model's runtime: by name (404 if unknown; the scope records it for
# metrics), and every runtime it serves.
Pick = Callable[[str, MutableMapping[str, Any]], ServerRuntime]


def voices(rt: ServerRuntime, model: str | None) -> dict[str, Any]:
    """One entry per voice: the built-in ones first, the default (the one a request
    without ``voice`` gets) first of all and marked, then the saved ones, oldest first. A
    model that speaks no voices lists none. ``model`` must be a name the server answers to
    (404 otherwise)."""
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
            "saved": False,
        }
        for i, v in enumerate(rt.adapter.voices())
    ]
    library = getattr(rt, "voices", None)
    if library is not None and rt.adapter.creates_voices:
        data += [e.describe(rt.model_name) for e in library.entries()]
    return {"object": "list", "data": data}


def install_voice_routes(app: FastAPI, pick: Pick, runtimes: Callable[[], list[ServerRuntime]]) -> None:
    """``POST /v1/audio/voices`` and ``DELETE /v1/audio/voices/{name}`` (the listing is
    the app's own route over ``voices``). Without a ``model`` they act on the first model
    that makes voices."""

    def runtime(model: str | None, scope: MutableMapping[str, Any]) -> ServerRuntime:
        if model:
            return pick(model, scope)
        served = runtimes()
        return next((rt for rt in served if rt.adapter.creates_voices), served[0])

    @app.post(
        "/v1/audio/voices", status_code=201, openapi_extra={"requestBody": _UPLOAD_BODY},
        responses={400: {"description": "Bad name, audio or transcript; a model that makes no voices"},
                   404: {"description": "Unknown model"}, 409: {"description": "The name is taken"},
                   413: {"description": "The clip's file is over the size limit"}},
    )
    async def create(request: Request) -> JSONResponse:
        """Make a saved voice from a reference clip. ``multipart/form-data`` (fields
        ``name``, ``audio`` (a file), optional ``transcript`` and ``model``) or JSON
        (``audio`` as base64). Other fields reach the model as options."""
        fields, audio = await _read_body(request, runtimes()[0].config.voice_max_bytes)
        rt = runtime(fields.pop("model", None), request.scope)
        return JSONResponse(await create_voice(rt, fields, audio), status_code=201)

    @app.delete("/v1/audio/voices/{name}", responses={404: {"description": "No such saved voice, or unknown model"}})
    async def delete(name: str, request: Request, model: str | None = None) -> dict[str, Any]:
        rt = runtime(model, request.scope)
        library = rt.voices
        if not rt.adapter.creates_voices or library.get(name) is None:
            raise ApiError(404, f"no saved voice {name!r} for model {rt.model_name!r}", param="name", code="voice_not_found")
        await asyncio.to_thread(library.delete, name)
        return {"object": "voice.deleted", "id": name, "deleted": True}


_FIELDS = {
    "name": {"type": "string", "description": "the voice's name (1-64 of A-Z a-z 0-9 _ . -)"},
    "transcript": {"type": "string", "description": "what the clip says (optional)"},
    "model": {"type": "string", "description": "the model to make it for (default: the first that makes voices)"},
}
# The body is read by hand (a file or base64), so its schema is declared for /openapi.json.
_UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {"schema": {
            "type": "object", "required": ["name", "audio"],
            "properties": {**_FIELDS, "audio": {"type": "string", "format": "binary", "description": "the reference clip"}},
        }},
        "application/json": {"schema": {
            "type": "object", "required": ["name", "audio"],
            "properties": {**_FIELDS, "audio": {"type": "string", "description": "the reference clip: base64, or a data: URL"}},
        }},
    },
}


async def create_voice(rt: ServerRuntime, fields: dict[str, Any], audio: bytes) -> dict[str, Any]:
    name = fields.pop("name", None)
    transcript = fields.pop("transcript", None) or None
    if name is None:
        raise ApiError(400, "name: required (the voice's name)", param="name", code="missing_field")
    check_name(name)
    if transcript is not None and not isinstance(transcript, str):
        raise ApiError(400, "transcript: must be a string", param="transcript")
    adapter = rt.adapter
    if not adapter.creates_voices:
        raise ApiError(400, f"model {rt.model_name!r} cannot make voices from reference audio", param="model", code="voice_cloning_not_supported")
    if name in {v.name for v in adapter.voices()} or rt.voices.get(name) is not None:
        raise ApiError(409, f"a voice named {name!r} already exists; delete it first or pick another name", param="name", code="voice_exists")
    upload = VoiceUpload(audio, transcript, rt.config.voice_max_seconds, fields)
    computed = await rt.preprocess.run(VOICE, upload, f"voice-{name}")
    made = voice_from_request(computed)
    tensors = await engine_voice_tensors(rt, made, f"voice-{name}") if isinstance(made, EngineVoice) else made
    entry = await asyncio.to_thread(
        rt.voices.save, name, tensors, transcript=transcript,
        sample_rate=int(computed.kwargs["sample_rate"]), duration_s=float(computed.kwargs["duration_s"]),
    )
    return entry.describe(rt.model_name)


async def _read_body(request: Request, limit: int) -> tuple[dict[str, Any], bytes]:
    """(fields, audio bytes) of a multipart or JSON body; errors name the field."""
    kind = request.headers.get("content-type", "")
    if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        fields: dict[str, Any] = {}
        audio: bytes | None = None
        form = await request.form()
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "audio":
                    raise ApiError(400, f"form field {key!r}: only 'audio' is a file", param=key)
                audio = await value.read(limit + 1)
            else:
                fields[key] = value
    elif kind.startswith("application/json"):
        try:
            body = loads_strict(await request.body())
        except UnsafeValue as exc:  # valid JSON no request may carry: named as in other bodies
            raise ApiError(400, exc.message, param=exc.param, code="invalid_value") from None
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        fields = dict(body)
        audio = _base64_audio(fields.pop("audio", None), limit)
    else:
        raise ApiError(400, "send multipart/form-data (an 'audio' file) or JSON (base64 'audio')", code="invalid_content_type")
    if not audio:
        raise ApiError(400, "audio: required (the reference clip)", param="audio", code="missing_field")
    if len(audio) > limit:
        raise ApiError(413, f"audio: the file is over {limit} bytes (--voice-max-bytes)", param="audio", code="audio_too_large")
    return fields, audio


def _base64_audio(value: Any, limit: int) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, "audio: base64 text (or a data: URL) expected", param="audio")
    if value.startswith("data:"):
        value = value.partition(",")[2]
    if len(value) > (limit + 2) // 3 * 4 + 4:  # before decoding: the decoded bytes would be over the limit
        raise ApiError(413, f"audio: the file is over {limit} bytes (--voice-max-bytes)", param="audio", code="audio_too_large")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "audio: not valid base64", param="audio", code="invalid_audio") from None

