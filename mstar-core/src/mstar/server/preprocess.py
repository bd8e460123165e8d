"""The preprocess pool: turning requests into engine inputs (tokenization, media
decoding, features) in worker processes, so the API's event loop never stalls on them.

Per request the plugin's ``mstar_offload_preprocess`` hook decides: pool (default) or
inline. A failing preprocess fails only its request; a crashed worker is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from mstar.api.adapter import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    SPEECH,
    TRANSCRIPTION,
    TRANSLATION,
    VOICE,
    ApiAdapter,
    EngineRequest,
)
from mstar.api.errors import ApiError
from mstar.api.voices import EngineVoice, SavedVoice, SessionVoice

SESSION_VOICE = "session_voice"  # a speech session's inline voice (ApiAdapter.session_voice)

log = logging.getLogger("mstar.server")

_METHODS = {CHAT: "chat_inputs", SPEECH: "speech_inputs", GENERATE: "generate_inputs", COMPLETIONS: "completion_inputs"}

_worker_adapter: ApiAdapter | None = None


def load_adapter(model: str, checkpoint_dir: str | Path) -> tuple[Any, ApiAdapter]:
    """(loaded model, its adapter; the base adapter when the model has none)."""
    from mstar.plugins.loading import load_model

    loaded = load_model(model)
    config = loaded.spec.load_config(Path(checkpoint_dir))
    adapter = loaded.hook.mstar_api_adapter(model_name=loaded.spec.name, config=config, checkpoint_dir=Path(checkpoint_dir))
    return loaded, adapter if adapter is not None else ApiAdapter()


def _init_worker(model: str, checkpoint_dir: str) -> None:
    global _worker_adapter
    import signal

    from mstar.server.parent_death import die_with_parent

    parent = mp.parent_process()
    die_with_parent(signal.SIGKILL, parent.pid if parent is not None else None)  # no orphan if the API process dies
    _worker_adapter = load_adapter(model, checkpoint_dir)[1]


def _ping() -> bool:
    return _worker_adapter is not None


def _adapter_call(adapter: ApiAdapter, endpoint: str, request: Any, voice: SavedVoice | None) -> EngineRequest:
    if endpoint == VOICE:  # a VoiceUpload: decoded here, off the API's event loop
        sample = request.decode()
        out = _voice_request(adapter.voice_tensors(sample))
        out.kwargs |= {"sample_rate": sample.sample_rate, "duration_s": sample.duration_s}
        return out
    if endpoint == SESSION_VOICE:  # the voice as tensors (or its engine request), its fields as kwargs
        made = adapter.session_voice(request)
        if made is None:
            return EngineRequest({})
        voice = made.voice
        out = _voice_request(voice if isinstance(voice, EngineVoice) else voice.tensors)
        out.kwargs |= {"fields": list(made.fields), "transcript": getattr(voice, "transcript", None)}
        return out
    if endpoint in (TRANSCRIPTION, TRANSLATION):  # the upload is decoded here, off the API's event loop
        decoded = request.decoded()
        out = adapter.transcription_inputs(decoded)
        out.kwargs.setdefault("audio_seconds", decoded.duration_s)
        return out
    if voice is not None:  # a speech (or spoken chat) request naming a saved voice
        if endpoint == CHAT:
            return adapter.chat_inputs_with_voice(request, voice)
        return adapter.speech_inputs_with_voice(request, voice)
    return getattr(adapter, _METHODS[endpoint])(request)


def _voice_request(made: dict[str, Any] | EngineVoice) -> EngineRequest:
    """A voice's tensors as inputs; an ``EngineVoice``'s engine inputs as inputs and the rest
    under kwarg ``engine_voice`` (undone by ``voice_from_request``)."""
    if not isinstance(made, EngineVoice):
        return EngineRequest(dict(made))
    rest = {"kwargs": made.kwargs, "outputs": list(made.outputs), "tensors": dict(made.tensors)}
    return EngineRequest(dict(made.inputs), {"engine_voice": rest})


def voice_from_request(out: EngineRequest) -> dict[str, Any] | EngineVoice:
    rest = out.kwargs.get("engine_voice")
    if rest is None:
        return dict(out.inputs)
    return EngineVoice(dict(out.inputs), dict(rest["kwargs"]), tuple(rest["outputs"]), dict(rest["tensors"]))


def _run_in_worker(endpoint: str, request: Any, voice: SavedVoice | None = None) -> EngineRequest:
    assert _worker_adapter is not None, "preprocess worker not initialised"
    out = _adapter_call(_worker_adapter, endpoint, request, voice)
    # Plain arrays back: pickled torch tensors travel as shared file descriptors, which
    # costs more than the bytes of a typical prompt.
    out.inputs = {k: _plain(v) for k, v in out.inputs.items()}
    return out


def _plain(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16:
        return value.detach().cpu().numpy()
    return value


class PreprocessPool:
    def __init__(self, model: str, checkpoint_dir: str | Path, adapter: ApiAdapter, hook: Any, workers: int) -> None:
        self.model = model
        self.checkpoint_dir = str(checkpoint_dir)
        self.adapter = adapter
        self.hook = hook
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        if self.workers > 0:
            self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker, initargs=(self.model, self.checkpoint_dir)
        )

    async def warm_up(self) -> None:
        """Start every worker now (importing the plugin takes seconds), not on the first request."""
        if self._pool is None:
            return
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, _ping) for _ in range(self.workers)))

    def offloads(self, request: Any) -> bool:
        decided = self.hook.mstar_offload_preprocess(model_name=self.model, request=request)
        return self._pool is not None and decided is not False

    async def run(self, endpoint: str, request: Any, request_id: str = "", voice: SavedVoice | None = None) -> EngineRequest:
        """The request's engine inputs (``voice``: the saved voice a speech request names).
        The adapter rejecting the request's values
        (``ValueError``, ``TypeError``, ``KeyError``) is the client's error, a 400; any other
        failure, and a crashed worker, is the server's: a 500, logged with ``request_id``."""
        try:
            if self.offloads(request):
                return await self._in_pool(endpoint, request, request_id, voice)
            return _adapter_call(self.adapter, endpoint, request, voice)
        except ApiError:
            raise
        except NotImplementedError:
            raise ApiError(404, f"model {self.model!r} does not serve the {endpoint} endpoint", code="endpoint_not_served") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise ApiError(400, f"preprocessing failed: {exc}", code="preprocess_failed") from None
        except Exception:
            log.exception("request %s: preprocessing failed (a server fault)", request_id)
            raise ApiError(500, f"preprocessing failed with an internal error; the server log has the details under request id {request_id}", code="preprocess_error") from None

    async def session_voice(self, request: Any, request_id: str = "") -> SessionVoice | None:
        """``ApiAdapter.session_voice`` of a speech session's settings, in the pool (an
        ``EngineVoice`` stays to be run); errors as in ``run``."""
        out = await self.run(SESSION_VOICE, request, request_id)
        if "fields" not in out.kwargs:
            return None
        made = voice_from_request(out)
        voice = made if isinstance(made, EngineVoice) else SavedVoice("session", made, out.kwargs["transcript"])
        return SessionVoice(voice, tuple(out.kwargs["fields"]))

    async def _in_pool(self, endpoint: str, request: Any, request_id: str, voice: SavedVoice | None) -> EngineRequest:
        assert self._pool is not None
        pool = self._pool
        try:
            out = await asyncio.get_running_loop().run_in_executor(pool, _run_in_worker, endpoint, request, voice)
        except BrokenProcessPool:
            log.error("request %s: a preprocess worker died; starting a new pool", request_id)
            if self._pool is pool:
                self._pool = self._new_pool()
                pool.shutdown(wait=False, cancel_futures=True)
            raise ApiError(500, "the preprocess worker crashed on this request; retry it", code="preprocess_crashed") from None
        # Arrays crossed the process boundary; tensors again, as EngineRequest holds them.
        return EngineRequest(out.inputs, out.kwargs, out.prompt_tokens)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
