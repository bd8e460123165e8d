"""The FastAPI application of the API process."""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles

from mstar import __version__
from mstar.api.adapter import SPEECH
from mstar.api.errors import ApiError, error_body, validation_error
from mstar.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SpeechRequest,
)
from mstar.api.transcription import TRANSCRIBE, TRANSLATE
from mstar.server.http_guard import BodyTimeout
from mstar.server.middleware import ApiKeyAuth, BodyLimit, Draining, RequestMetrics
from mstar.server.model_set import ModelSet, card
from mstar.server.openapi import install_openapi
from mstar.server.routes_chat import chat_completions
from mstar.server.routes_completions import completions
from mstar.server.routes_generate import generate, upload_request
from mstar.server.routes_plugin import adapter_routes, install_adapter_routes
from mstar.server.routes_realtime import realtime
from mstar.server.routes_speech import speech
from mstar.server.routes_transcriptions import read_form, transcriptions
from mstar.server.routes_voices import install_voice_routes, voices
from mstar.server.routes_ws_speech import speech_stream
from mstar.server.runtime import ServerRuntime
from mstar.server.strict_json import StrictJSONRoute
from mstar.server.warmup import warm_up

STATIC_DIR = Path(__file__).parent / "static"  # the playground page

log = logging.getLogger("mstar.server")

ENDPOINTS = {
    "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/audio/speech", "/v1/generate", "/v1/generate/upload", "/health", "/metrics", "/version",
    "/v1/audio/voices", "/", "/v1/audio/transcriptions", "/v1/audio/translations",
}


def create_app(models: ServerRuntime | ModelSet, *, manage_runtime: bool = True) -> FastAPI:
    """The app over one model's runtime or several (``ModelSet``), routed by ``model``."""
    ms = models if isinstance(models, ModelSet) else ModelSet([models])

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        if manage_runtime:
            await ms.start(warm_up)  # engines ready and warm before uvicorn binds the port
        try:
            yield
        finally:
            if manage_runtime:
                await ms.stop()

    app = FastAPI(title="M* server", version=__version__, lifespan=lifespan)
    app.router.route_class = StrictJSONRoute
    _routes(app, ms)
    # Routes the plugins serve themselves, counted under their own paths.
    plugin_routes = adapter_routes(ms.runtimes, {r.path for r in app.routes if hasattr(r, "path")})
    install_adapter_routes(app, plugin_routes)
    _error_handlers(app, ms)
    install_openapi(app, api_key=bool(ms.config.api_key))
    # Outermost last: metrics see every response, auth runs before the body is read.
    app.add_middleware(BodyLimit, max_bytes=ms.config.max_body_bytes)
    app.add_middleware(BodyTimeout, timeout_s=ms.config.body_timeout_s)
    app.add_middleware(ApiKeyAuth, api_key=ms.config.api_key)
    app.add_middleware(Draining, is_draining=lambda: ms.draining, retry_after=ms.retry_after_s)
    app.add_middleware(RequestMetrics, metrics=ms.metrics, endpoints=ENDPOINTS | {route.path for route, _ in plugin_routes})
    return app


def _routes(app: FastAPI, ms: ModelSet) -> None:
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": ms.cards()}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict[str, Any]:
        return card(ms.get(model_id))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await chat_completions(ms.get(body.model, request.scope), body, request.receive)

    @app.post("/v1/completions")
    async def text_completions(body: CompletionRequest, request: Request) -> Response:
        return await completions(ms.get(body.model, request.scope), body, request.receive)

    @app.post("/v1/audio/speech")
    async def audio_speech(body: SpeechRequest, request: Request) -> Response:
        return await speech(ms.get(body.model, request.scope), body, request.receive)

    @app.post("/v1/audio/transcriptions")
    async def audio_transcriptions(request: Request) -> Response:
        # multipart/form-data, as OpenAI's: the audio in "file", the other fields beside it.
        body = await read_form(request, TRANSCRIBE)
        return await transcriptions(ms.get(body.model, request.scope), body, request.receive)

    @app.post("/v1/audio/translations")
    async def audio_translations(request: Request) -> Response:
        body = await read_form(request, TRANSLATE)
        return await transcriptions(ms.get(body.model, request.scope), body, request.receive)

    @app.websocket("/v1/audio/speech/stream")
    async def audio_speech_stream(websocket: WebSocket, model: str | None = None) -> None:
        # ``?model=`` picks the model; else the first that speaks, or the first session
        # message's ``model``.
        await speech_stream(ms.first_serving(SPEECH), websocket, ms.get, model)

    @app.websocket("/v1/realtime")
    async def realtime_session(websocket: WebSocket, model: str | None = None) -> None:
        # OpenAI's Realtime API; ``?model=`` picks the model (default: the first that hears).
        await realtime(ms.runtimes, websocket, ms.get, model)

    @app.get("/v1/audio/voices", responses={404: {"description": "Unknown model"}})
    async def audio_voices(model: str | None = None) -> dict[str, Any]:
        if model is not None:
            return voices(ms.get(model), model)
        return {"object": "list", "data": [v for rt in ms.runtimes for v in voices(rt, None)["data"]]}

    install_voice_routes(app, ms.get, lambda: ms.runtimes)

    @app.get("/", include_in_schema=False)
    async def playground() -> Response:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.post("/v1/generate")
    async def native_generate(body: GenerateRequest, request: Request) -> Response:
        return await generate(ms.get(body.model, request.scope), body, request.receive)

    @app.post("/v1/generate/upload")
    async def native_generate_upload(request: Request) -> Response:
        # multipart/form-data: the JSON body in a "request" field, files as inputs.
        body = await upload_request(request)
        return await generate(ms.get(body.model, request.scope), body, request.receive)

    @app.get("/health", responses={404: {"description": "Unknown model"}})
    async def health(model: str | None = None) -> Response:
        # ``?model=``: that model's health alone (a probe per model).
        status, body, wait = ms.health(model)
        return JSONResponse(body, status_code=status, headers=None if status == 200 else {"retry-after": str(wait)})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ms.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": __version__, **ms.version()}


def _error_handlers(app: FastAPI, ms: ModelSet) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        # A 503 is about the model the request went to (its restart's wait), if any.
        return JSONResponse(exc.body(), status_code=exc.status, headers=retry_after(ms.of_scope(request.scope) or ms, exc.status))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        err = validation_error(list(exc.errors()))
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no endpoint {request.method} {request.url.path}; see GET /v1/models and the API docs at /docs"
            return JSONResponse(error_body(message, "not_found_error", None, "unknown_endpoint"), status_code=404)
        code = {405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large"}.get(exc.status_code)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        # Keeps Starlette's headers: ``Allow`` on a 405.
        return JSONResponse(error_body(str(exc.detail), kind, None, code), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        error_id = f"err-{uuid.uuid4().hex[:12]}"
        log.error("internal error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
        message = f"internal server error; the server log has the details under {error_id}"
        return JSONResponse(error_body(message, "server_error", None, "internal_error"), status_code=500)


def retry_after(rt: ServerRuntime | ModelSet, status: int) -> dict[str, str] | None:
    """``Retry-After`` for the statuses a client should retry: 429 (queue full) and 503
    (engine restarting or down, server draining)."""
    if status == 429:
        return {"retry-after": "1"}
    if status == 503:
        return {"retry-after": str(rt.retry_after_s())}
    return None
