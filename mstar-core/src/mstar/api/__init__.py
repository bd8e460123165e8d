"""The HTTP API's model-facing parts: request/response bodies, errors and ``ApiAdapter``."""

from mstar.api.adapter import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    SPEECH,
    ApiAdapter,
    EngineRequest,
    TextDecoder,
    Voice,
)
from mstar.api.errors import ApiError

__all__ = ["CHAT", "COMPLETIONS", "GENERATE", "SPEECH", "ApiAdapter", "ApiError", "EngineRequest", "TextDecoder", "Voice"]
