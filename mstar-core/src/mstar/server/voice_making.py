"""Voices the engines compute (``mstar.api.voices.EngineVoice``, e.g. a clip's speaker
embedding from a model's encoder node): one engine request whose output signals, one value
each, join the tensors the preprocess pool computed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mstar.api.adapter import VOICE, EngineRequest
from mstar.api.errors import ApiError
from mstar.api.voices import EngineVoice, SavedVoice, SessionVoice
from mstar.server.execution import Execution

if TYPE_CHECKING:
    from mstar.server.runtime import ServerRuntime


async def engine_voice_tensors(rt: ServerRuntime, voice: EngineVoice, prefix: str = "voice") -> dict[str, torch.Tensor]:
    """Runs ``voice``'s engine request (through admission, like any request); errors as the
    request's (a bad clip the engines reject is a 400)."""
    ex = Execution(rt, VOICE, prefix=prefix)
    got: dict[str, torch.Tensor] = {}
    try:
        await ex.start(None, None, list(voice.outputs), prepared=EngineRequest(voice.inputs, voice.kwargs))
        async for batch in ex.batches():
            got.update(batch)
    finally:
        ex.close()
    missing = [name for name in voice.outputs if name not in got]
    if missing:
        raise ApiError(500, f"making the voice: the engines sent no {missing} (request {ex.request_id})", code="voice_not_made")
    return {**voice.tensors, **got}


async def session_voice_made(rt: ServerRuntime, made: SessionVoice, prefix: str) -> SessionVoice:
    """``made`` with its voice computed, when the engines compute it."""
    if not isinstance(made.voice, EngineVoice):
        return made
    return SessionVoice(SavedVoice("session", await engine_voice_tensors(rt, made.voice, prefix)), made.fields)
