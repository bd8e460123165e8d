"""One request's life in the API process: sampling, admission, preprocessing, submission,
outputs, timeout and clean-up (abort if unfinished, free the admission slot)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import torch

from mstar.api.adapter import EngineRequest
from mstar.api.errors import ApiError
from mstar.api.sampling import RequestSampling, resolve_sampling
from mstar.api.voices import SavedVoice
from mstar.server.router import Finished, RequestStream
from mstar.server.voice_library import saved_voice

if TYPE_CHECKING:
    from mstar.server.runtime import ServerRuntime

Item = tuple[str, torch.Tensor]


def check_prompt_ids(inputs: dict[str, torch.Tensor], node_samplers: dict[str, Any]) -> None:
    """A node's declared prompt signal holds token ids: a 1-D integer tensor (never bool,
    float or NaN); anything else is a 400 naming the input."""
    for decl in node_samplers.values():
        name = getattr(decl, "prompt_signal", None)
        value = inputs.get(name) if name else None
        if value is None:
            continue
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise ApiError(400, f"inputs.{name}: token ids must be integers, got {str(value.dtype).removeprefix('torch.')}", param=f"inputs.{name}", code="invalid_value")
        if value.dim() != 1:
            raise ApiError(400, f"inputs.{name}: token ids must be a 1-D list, got shape {list(value.shape)}", param=f"inputs.{name}", code="invalid_value")


class Execution:
    def __init__(self, runtime: ServerRuntime, endpoint: str, prefix: str = "req") -> None:
        self.rt = runtime
        self.endpoint = endpoint
        self.request_id = f"{prefix}-{uuid.uuid4().hex}"
        self.arrival = time.perf_counter()
        self.engine_request: EngineRequest | None = None
        self.seeds: dict[str, int] = {}
        self.finish_reason: str | None = None
        self._stream: RequestStream | None = None
        self._admitted = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def seed(self) -> int | None:
        """The seed reported to clients: the one of the node OpenAI sampling fields drive."""
        node = self.rt.adapter.sampling_node or next(iter(self.seeds), None)
        return self.seeds.get(node) if node else None

    async def start(self, request: Any, sampling: RequestSampling | dict[str, Any] | None, signals: list[str] | None,
                    voice: SavedVoice | None = None, prepared: EngineRequest | None = None) -> None:
        """Everything up to the request running in the engines; raises ``ApiError``.
        ``voice``: the voice to speak with (default: the saved voice the request names);
        ``prepared``: engine inputs made already (no preprocessing of ``request``)."""
        try:
            configs, self.seeds = resolve_sampling(self.rt.node_samplers, self.rt.adapter.sampling_node, sampling)
            await self.rt.admission.acquire()
            self._admitted = True
            if prepared is None:
                voice = voice or saved_voice(self.rt, self.endpoint, request)
                prepared = await self.rt.preprocess.run(self.endpoint, request, self.request_id, voice)
            self.engine_request = prepared
            inputs = self.engine_request.inputs
            check_prompt_ids(inputs, self.rt.node_samplers)
            if self._closed:  # the client left while we were preparing
                raise ApiError(499, "client closed the request")
            self._stream = self.rt.router.submit(self.request_id, inputs, configs, self.engine_request.kwargs, signals)
            # Out of the engines (finished, failed, aborted): its slot is free for the next
            # request at once, even while its response still waits for a slow client.
            self._stream.on_finish = self._release_admission
            timeout = self.rt.config.request_timeout_s
            if timeout:
                self._timer = asyncio.get_running_loop().call_later(
                    timeout, self.rt.router.fail, self.request_id,
                    Finished("error", f"the request timed out after {timeout:g}s", 504),
                )
        except BaseException:
            self.close()
            raise

    async def batches(self) -> AsyncIterator[list[Item]]:
        """Output items as they come, grouped by what arrived together; raises
        ``ApiError`` when the request fails. Sets ``finish_reason`` at the end."""
        assert self._stream is not None
        while True:
            items = await self._stream.next_batch()
            values: list[Item] = []
            for item in items:
                if isinstance(item, Finished):
                    if values:
                        yield values
                    self._finished(item)
                    return
                values.append(item)
            yield values

    def _finished(self, fin: Finished) -> None:
        self.finish_reason = fin.reason
        self._cancel_timer()
        if fin.reason == "error":
            raise ApiError(fin.status, fin.error or "the request failed in the engine", code=fin.code or "engine_error")

    def stop(self) -> None:
        """End the request early (e.g. a stop string matched); not an error."""
        self.finish_reason = "stop"
        self.close()

    def close(self) -> None:
        """Idempotent clean-up; aborts the request in the engines if it is still running."""
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        if self._stream is not None:
            if not self._stream.done:
                self.rt.router.abort(self.request_id)
            self._stream.release()  # output nobody will read: out of the server's total now
            self.rt.metrics.finished.labels(self.finish_reason or "abort").inc()
        self._release_admission()

    def _release_admission(self) -> None:
        if self._admitted:
            self._admitted = False
            self.rt.admission.release()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
