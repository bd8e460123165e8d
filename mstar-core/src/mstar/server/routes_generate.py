"""``POST /v1/generate``: native engine inputs in, output signals out as base64 tensors
or safetensors bytes; ``stream`` gives NDJSON, one line per output value."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import torch
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from mstar.api.adapter import GENERATE
from mstar.api.errors import ApiError
from mstar.api.protocol import GenerateRequest
from mstar.api.tensors import concat_signal, safetensors_bytes, tensor_to_json
from mstar.server.execution import Execution
from mstar.server.runtime import ServerRuntime
from mstar.server.streaming import (
    ManagedStreamingResponse,
    abort_on_disconnect,
    ending_with_error,
    ndjson,
)


def client_signals(rt: ServerRuntime) -> list[str]:
    return [name for name, sig in rt.graph.signals.items() if sig.to_client]


async def generate(rt: ServerRuntime, req: GenerateRequest, receive: Receive) -> Response:
    rt.check_model(req.model)
    known = client_signals(rt)
    if req.signals is not None:
        unknown = sorted(set(req.signals) - set(known))
        if unknown:
            raise ApiError(400, f"unknown output signal(s) {unknown}; this model outputs {known}", param="signals")
    missing = sorted(set(rt.graph.request_inputs) - set(req.inputs))
    if missing:
        raise ApiError(400, f"missing input(s) {missing}; this model takes {list(rt.graph.request_inputs)}", param="inputs")
    ex = Execution(rt, GENERATE, prefix="gen")
    await ex.start(req, req.sampling, req.signals)
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
    joined = {name: concat_signal(parts) for name, parts in outputs.items()}
    if req.output_format == "safetensors":
        meta = {"finish_reason": ex.finish_reason or "stop", "seeds": repr(ex.seeds), "id": ex.request_id}
        return Response(safetensors_bytes(joined, meta), media_type="application/octet-stream", headers={"x-request-id": ex.request_id})
    return JSONResponse(_body(rt, ex, {k: tensor_to_json(v) for k, v in joined.items()}))


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
