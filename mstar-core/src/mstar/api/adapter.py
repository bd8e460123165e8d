"""``ApiAdapter``: how a model meets the HTTP API (implemented by plugins through the
``mstar_api_adapter`` hook).

Core stays model-agnostic: it parses and validates requests, maps OpenAI sampling fields
onto ``SamplingParams``, runs the engines and encodes responses. The adapter says which
endpoints the model serves, turns a request into engine inputs (this runs in the
preprocess pool, so it must be picklable and must not touch devices), and names the output
signals that carry text and audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest, GenerateRequest, SpeechRequest
from mstar.api.tensors import tensor_from_json

CHAT, SPEECH, GENERATE = "chat", "speech", "generate"


@dataclass
class EngineRequest:
    """What one request becomes: engine inputs by name, request kwargs, and the prompt
    length to report as ``usage.prompt_tokens``."""

    inputs: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0


class TextDecoder:
    """Turns one request's text-signal values into text deltas (stateful: a token may end
    mid-character). The default reads values as Unicode code points."""

    def decode(self, value: torch.Tensor) -> str:
        return "".join(chr(int(i)) for i in value.reshape(-1).tolist())

    def flush(self) -> str:
        return ""


class ApiAdapter:
    """Base class of a model's API adapter. Override what the model serves."""

    #: Endpoints served besides ``/v1/generate`` (always served): {"chat", "speech"}.
    endpoints: ClassVar[frozenset[str]] = frozenset()
    #: Output signal carrying text tokens (chat), and audio samples (speech, chat audio).
    text_signal: str | None = None
    audio_signal: str | None = None
    sample_rate: int | None = None
    #: The node OpenAI sampling fields apply to (default: the first sampling node).
    sampling_node: str | None = None
    #: Whether chat completions can produce audio (``modalities: ["audio"]``).
    chat_audio: bool = False
    supports_logprobs: bool = False
    max_n: int = 1

    def serves(self, endpoint: str) -> bool:
        return endpoint == GENERATE or endpoint in self.endpoints

    # ---- requests → engine inputs (preprocess pool) ---------------------------------
    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        raise NotImplementedError

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        raise NotImplementedError

    def generate_inputs(self, request: GenerateRequest) -> EngineRequest:
        """Native inputs: each JSON tensor as it is."""
        return EngineRequest({k: tensor_from_json(v, k) for k, v in request.inputs.items()}, dict(request.kwargs))

    # ---- engine outputs → responses --------------------------------------------------
    def text_decoder(self) -> TextDecoder:
        return TextDecoder()

    def count_tokens(self, value: torch.Tensor) -> int:
        return int(value.numel())

    def audio_chunk(self, value: torch.Tensor) -> np.ndarray:
        """Mono float32 samples in [-1, 1]."""
        return value.detach().to(torch.float32).reshape(-1).numpy()

    # ---- start-up ------------------------------------------------------------------
    def warmup_request(self) -> ChatCompletionRequest | SpeechRequest | GenerateRequest | None:
        """A small request the server runs through every engine before opening its port."""
        if CHAT in self.endpoints:
            return ChatCompletionRequest(model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
        if SPEECH in self.endpoints:
            return SpeechRequest(model="", input="Hi", max_tokens=2, temperature=0)
        return None


def not_served(model: str, endpoint: str) -> ApiError:
    return ApiError(404, f"model {model!r} does not serve the {endpoint} endpoint", code="endpoint_not_served")
