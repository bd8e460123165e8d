"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations`` in OpenAI's shape:
a multipart body (``file``, ``model``, ``language``, ``prompt``, ``temperature``,
``response_format``, ``stream``), the text whole in ``response_format`` or, with ``stream``,
as server-sent ``transcript.text.delta`` events and one ``transcript.text.done``.

The model's adapter opts in (``TRANSCRIPTION`` / ``TRANSLATION`` in ``endpoints``) and turns
the decoded upload into engine inputs (``ApiAdapter.transcription_inputs``, in the
preprocess pool, where the file is decoded too)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mstar.api.adapter import not_served, transcription_endpoint
from mstar.api.errors import ApiError, validation_error
from mstar.api.sampling import request_sampling
from mstar.api.transcription import (
    MEDIA_TYPES,
    STREAMABLE,
    TRANSLATE,
    TranscriptionRequest,
    response_body,
)
from mstar.server.execution import Execution
from mstar.server.output_tracker import OutputTracker
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    sse,
)

# Form fields read as lists (``include[]``, ``timestamp_granularities[]``): accepted, not used.
_LIST_FIELDS = ("include[]", "timestamp_granularities[]")


async def read_form(request: Request, task: str) -> TranscriptionRequest:
    """The multipart body as a request; each problem is a 400 naming its field."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "send multipart/form-data with the audio in a 'file' part", code="invalid_content_type")
    form = await request.form()
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if name in _LIST_FIELDS:
            continue
        if name == "file":
            if not isinstance(value, UploadFile):
                raise ApiError(400, "file: must be a file part (the audio to transcribe)", param="file", code="invalid_value")
            fields["file"], fields["filename"] = await value.read(), value.filename
        elif isinstance(value, UploadFile):
            raise ApiError(400, f"form field {name!r}: only 'file' is a file part", param=name)
        else:
            fields[name] = value
    if "file" not in fields:
        raise ApiError(400, "file: required (the audio to transcribe)", param="file", code="missing_field")
    if not fields["file"]:
        raise ApiError(400, "file: the file is empty", param="file", code="invalid_audio")
    if task == TRANSLATE and "language" in fields:  # OpenAI's translations have no language: English out
        raise ApiError(400, "language: translations are always into English; omit language", param="language")
    try:
        return TranscriptionRequest.model_validate({**fields, "task": task})
    except ValidationError as exc:
        raise validation_error(exc) from None


async def transcriptions(rt: ServerRuntime, req: TranscriptionRequest, receive: Callable[..., Any]) -> Response:
    adapter = rt.adapter
    rt.check_model(req.model)
    endpoint = transcription_endpoint(req)
    if not adapter.serves(endpoint) or not adapter.text_signal:
        raise not_served(req.model, f"audio {endpoint}s")
    if req.stream and req.response_format not in STREAMABLE:
        raise ApiError(400, f"response_format {req.response_format!r} cannot be streamed; use json or text", param="stream")
    req = req.model_copy(update={"max_seconds": adapter.max_audio_seconds})
    ex = Execution(rt, endpoint, prefix="trsc")
    await ex.start(req, request_sampling(req, max_tokens=("max_tokens", req.max_tokens)), [adapter.text_signal])
    out = OutputTracker(rt, ex, adapter.text_decoder())
    headers = {"x-request-id": ex.request_id, **({"x-mstar-seed": str(ex.seed)} if ex.seed is not None else {})}
    duration = float((ex.engine_request.kwargs if ex.engine_request else {}).get("audio_seconds", 0.0))
    if req.stream:
        body = ending_with_error(_sse(ex, out), ex, lambda exc: (sse(exc.body()),))
        return ManagedStreamingResponse(body, ex.close, media_type="text/event-stream", headers=headers)
    try:
        async with abort_on_disconnect(receive, ex.close):
            async for batch in ex.batches():
                out.consume(batch)
        out.finish()
    finally:
        ex.close()
    whole = response_body(req, out.text.text, duration, _usage(ex, out))
    if isinstance(whole, dict):
        return JSONResponse(whole, headers=headers)
    return Response(whole, media_type=MEDIA_TYPES[req.response_format], headers=headers)


def _usage(ex: Execution, out: OutputTracker) -> dict[str, Any]:
    prompt = ex.engine_request.prompt_tokens if ex.engine_request else 0
    return {"type": "tokens", "input_tokens": prompt, "output_tokens": out.tokens, "total_tokens": prompt + out.tokens}


async def _sse(ex: Execution, out: OutputTracker) -> AsyncIterator[bytes]:
    async for batch in ex.batches():
        text, _ = out.consume(batch)
        if text:
            yield sse({"type": "transcript.text.delta", "delta": text})
    tail = out.finish()  # the detokenizer's flush (e.g. a cut multi-byte character)
    if tail:
        yield sse({"type": "transcript.text.delta", "delta": tail})
    if ex.finish_reason != "abort":
        yield sse({"type": "transcript.text.done", "text": out.text.text, "usage": _usage(ex, out)})
