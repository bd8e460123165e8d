"""Client events of ``WS /v1/realtime`` (OpenAI's Realtime API, GA names), as pydantic models.

Only what M* acts on is modelled; every model ignores fields it does not know (OpenAI's
clients send many, e.g. ``tools``, ``tracing``), and validates every field it does know, so
a wrong type or value is an ``error`` event naming the field. Besides OpenAI's fields, the
session takes M*'s sampling fields (``temperature``, ``top_p``, ``top_k``, ``seed``,
``sampling``, ...), the same as ``/v1/chat/completions``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_LENIENT = ConfigDict(extra="allow")

#: The chat fields a session (or a ``response.create``) may set beside OpenAI's.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "stop", "min_tokens", "ignore_eos", "sampling")


class AudioFormat(BaseModel):
    """PCM16 little-endian mono at 24 kHz: the only format served (both ways)."""

    model_config = _LENIENT

    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class ServerVad(BaseModel):
    model_config = _LENIENT

    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True


class InputTranscription(BaseModel):
    """``audio.input.transcription``: transcribe each committed user audio item with the
    served model (as ``/v1/audio/transcriptions``). ``model``: this session's model (or
    left out); besides OpenAI's ``language`` and ``prompt``, M*'s sampling fields
    (``seed``, ``temperature``, ...) and ``max_tokens``, as the transcriptions route takes."""

    model_config = _LENIENT

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInput(BaseModel):
    model_config = _LENIENT

    format: AudioFormat | None = None
    turn_detection: ServerVad | None = None  # null turns it off (set explicitly)
    transcription: InputTranscription | None = None  # null turns it off (set explicitly)


class AudioOutput(BaseModel):
    model_config = _LENIENT

    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = None


class SessionAudio(BaseModel):
    model_config = _LENIENT

    input: AudioInput | None = None
    output: AudioOutput | None = None


Modalities = list[Literal["text", "audio"]]


class SessionConfig(BaseModel):
    """``session.update``'s ``session``: a partial update (fields left out keep their value)."""

    model_config = _LENIENT

    type: Literal["realtime"] | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: Modalities | None = Field(None, min_length=1)
    audio: SessionAudio | None = None
    max_output_tokens: int | Literal["inf"] | None = None


class ResponseAudio(BaseModel):
    model_config = _LENIENT

    output: AudioOutput | None = None


class ResponseConfig(BaseModel):
    """``response.create``'s ``response``: this response only."""

    model_config = _LENIENT

    instructions: str | None = None
    output_modalities: Modalities | None = Field(None, min_length=1)
    audio: ResponseAudio | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    metadata: dict[str, str] | None = None
    conversation: Literal["auto", "none"] | None = None


class ContentPart(BaseModel):
    model_config = _LENIENT

    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None  # base64 PCM16 24 kHz
    transcript: str | None = None


class Item(BaseModel):
    model_config = _LENIENT

    id: str | None = Field(None, max_length=64)
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1)


class SessionUpdate(BaseModel):
    model_config = _LENIENT
    type: Literal["session.update"]
    session: SessionConfig


class AudioAppend(BaseModel):
    model_config = _LENIENT
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommit(BaseModel):
    model_config = _LENIENT
    type: Literal["input_audio_buffer.commit"]


class AudioClear(BaseModel):
    model_config = _LENIENT
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(BaseModel):
    model_config = _LENIENT
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: str | None = None


class ItemTruncate(BaseModel):
    model_config = _LENIENT
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ItemDelete(BaseModel):
    model_config = _LENIENT
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemRetrieve(BaseModel):
    model_config = _LENIENT
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ResponseCreate(BaseModel):
    model_config = _LENIENT
    type: Literal["response.create"]
    response: ResponseConfig | None = None


class ResponseCancel(BaseModel):
    model_config = _LENIENT
    type: Literal["response.cancel"]
    response_id: str | None = None


CLIENT_EVENTS: dict[str, type[BaseModel]] = {
    m.model_fields["type"].annotation.__args__[0]: m  # type: ignore[union-attr]
    for m in (SessionUpdate, AudioAppend, AudioCommit, AudioClear, ItemCreate, ItemTruncate, ItemDelete, ItemRetrieve,
              ResponseCreate, ResponseCancel)
}


def parse_event(body: Any) -> BaseModel:
    """A decoded JSON message → its event model; ``KeyError`` for an unknown ``type``,
    pydantic's ``ValidationError`` for a bad field."""
    kind = body.get("type") if isinstance(body, dict) else None
    model = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise KeyError(kind)
    return model.model_validate(body)
