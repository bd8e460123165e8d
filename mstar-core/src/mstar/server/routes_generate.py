"""``POST /v1/generate``: native engine inputs in, output signals out as base64 tensors
or safetensors bytes; ``stream`` gives NDJSON, one line per output value.

``POST /v1/generate/upload`` takes the same request as ``multipart/form-data``: a ``request``
field holding the JSON body and file parts, each becoming the input of its field name as a
1-D uint8 tensor of the file's bytes (e.g. a video upload; the model's adapter decodes it).
The graph's inputs are checked on what the adapter's ``generate_inputs`` made of them, so an
adapter may take a part under a name of its own (``audio``) and decode it into its inputs.

The ``logits`` signal (kwarg ``return_logits``) comes back as ``[steps, vocab]``: one row per
sampled token; every other signal's values are joined along their first dimension."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import torch
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar.api.adapter import GENERATE
from mstar.api.errors import ApiError, validation_error
from mstar.api.protocol import GenerateRequest
from mstar.api.tensors import concat_signal, safetensors_bytes, tensor_to_json
from mstar.engine.executors import LOGITS
from mstar.server.execution import Execution
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    ndjson,
)
from mstar.server.strict_json import UnsafeValue, loads_strict


async def upload_request(request: Request) -> GenerateRequest:
    """The request of a multipart body; errors are 400s naming the field."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "send multipart/form-data here (JSON bodies go to /v1/generate)", code="invalid_content_type")
    form = await request.form()
    field = form.get("request")
    try:
        data = loads_strict(field.encode()) if isinstance(field, str) else {}
    except UnsafeValue as exc:  # valid JSON no request may carry: named as in a JSON body
        raise ApiError(400, exc.message, param=exc.param or "request", code="invalid_value") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request field is not valid JSON: {exc}", param="request", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request field must be a JSON object", param="request")
    inputs = dict(data.get("inputs") or {})
    for name, part in form.multi_items():
        if name == "request":
            continue
        if not isinstance(part, UploadFile):
            raise ApiError(400, f"form field {name!r}: only 'request' and file parts are read", param=name)
        raw = await part.read()
        inputs[name] = {"dtype": "uint8", "shape": [len(raw)], "data": base64.b64encode(raw).decode()}
    try:
        return GenerateRequest.model_validate({**data, "inputs": inputs})
    except ValidationError as exc:
        raise validation_error(exc) from None


def client_signals(rt: ServerRuntime) -> list[str]:
    """The graph's client outputs, and the engine's per-step logits (kwarg return_logits)."""
    return [*(name for name, sig in rt.graph.signals.items() if sig.to_client), LOGITS]


async def generate(rt: ServerRuntime, req: GenerateRequest, receive: Receive) -> Response:
    rt.check_model(req.model)
    known = client_signals(rt)
    if req.signals is not None:
        unknown = sorted(set(req.signals) - set(known))
        if unknown:
            raise ApiError(400, f"unknown output signal(s) {unknown}; this model outputs {known}", param="signals")
    ex = Execution(rt, GENERATE, prefix="gen")
    # The adapter first: it may map the request's (or an upload's) names onto the graph's inputs.
    prepared = await rt.preprocess.run(GENERATE, req, ex.request_id)
    missing = rt.graph.missing_inputs(prepared.inputs)
    if missing:
        raise ApiError(400, f"missing input(s) {missing}; this model takes {list(rt.graph.request_inputs)}", param="inputs")
    await ex.start(req, req.sampling, req.signals, prepared=prepared)
    if req.stream:
        body = ending_with_error(_ndjson(ex), ex, lambda exc: _ndjson_error_frames(ex, exc))
        return ManagedStreamingResponse(body, ex.close, media_type="application/x-ndjson", headers={"x-request-id": ex.request_id})
    outputs: dict[str, list[torch.Tensor]] = {}
    try:
        async with abort_on_disconnect(receive, ex.close):
            async for batch in ex.batches():
                for signal, value in batch:
                    outputs.setdefault(signal, []).append(value)
    finally:
        ex.close()
    joined = {name: _joined(name, parts) for name, parts in outputs.items()}
    if req.output_format == "safetensors":
        meta = {"finish_reason": ex.finish_reason or "stop", "seeds": repr(ex.seeds), "id": ex.request_id}
        return Response(safetensors_bytes(joined, meta), media_type="application/octet-stream", headers={"x-request-id": ex.request_id})
    return JSONResponse(_body(rt, ex, {k: tensor_to_json(v) for k, v in joined.items()}))


def _joined(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """A signal's values as one tensor: logits stacked to ``[steps, vocab]``, others
    concatenated along dim 0. (Logits of sampling nodes with different vocabularies in one
    request cannot stack: those stay joined flat, each step's ``[vocab]`` after the other.)"""
    if name == LOGITS and parts and len({p.numel() for p in parts}) == 1:
        return torch.stack([p.reshape(-1) for p in parts])
    return concat_signal(parts)


def _body(rt: ServerRuntime, ex: Execution, outputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": ex.request_id,
        "object": "generation",
        "model": rt.model_name,
        "outputs": outputs,
        "finish_reason": ex.finish_reason,
        "seeds": ex.seeds,
    }


async def _ndjson(ex: Execution) -> AsyncIterator[bytes]:
    async for batch in ex.batches():
        for signal, value in batch:
            yield ndjson({"signal": signal, "tensor": tensor_to_json(value)})
    if ex.finish_reason != "abort":
        yield ndjson({"finished": True, "finish_reason": ex.finish_reason, "id": ex.request_id, "seeds": ex.seeds})


def _ndjson_error_frames(ex: Execution, exc: ApiError) -> tuple[bytes, bytes]:
    return ndjson(exc.body()), ndjson({"finished": True, "finish_reason": "error", "id": ex.request_id, "seeds": ex.seeds})
