"""Request and response bodies of the HTTP API (OpenAI-compatible plus M*'s native ones).

Requests ignore fields they do not know (OpenAI clients send many optional ones); every
field they do know is validated, and a wrong type or value is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_LENIENT = ConfigDict(extra="allow")
_STRICT = ConfigDict(extra="forbid")


class SamplingExtension(BaseModel):
    """M*'s extension field ``sampling``: main-sampler fields and aux samplers by label.

    Example: ``{"top_k": 20, "aux": {"residual": {"temperature": 0.7}}}``. Fields are
    those of ``mstar.sampling.SamplingParams``; an unknown aux label is a 400. These apply
    to the node OpenAI's fields drive (the adapter's ``sampling_node``).

    ``nodes`` sets any sampling node of the model in the same shape, e.g.
    ``{"nodes": {"talker": {"temperature": 0.9, "aux": {"code_predictor": {"top_k": 50}}}}}``;
    an unknown node is a 400 listing the sampling nodes. For the node OpenAI's fields drive,
    the top-level fields and the fields above win over its ``nodes`` entry.
    """

    model_config = ConfigDict(extra="allow")

    aux: dict[str, dict[str, Any]] = Field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def main_fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# ---- chat completions -----------------------------------------------------------------


class ContentPart(BaseModel):
    model_config = _LENIENT

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _LENIENT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; non-text parts are the adapter's to handle or reject."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(BaseModel):
    model_config = _LENIENT

    include_usage: bool = False


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form of ``voice``: ``{"id": "voice_1234"}``."""

    model_config = _LENIENT

    id: str


class AudioOutputOptions(BaseModel):
    """Chat ``audio``: the voice (a name, or ``{"id": name}``) and the container format.
    Values are checked against the model (its voices) and ``mstar.api.audio`` (formats) by
    the route, so the 400 can list what is valid."""

    model_config = _LENIENT

    voice: str | VoiceRef | None = None
    format: str = "wav"

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class _SamplingFields(BaseModel):
    """OpenAI's sampling fields plus vLLM-style extensions; ranges are checked by
    ``mstar.sampling.SamplingParams`` so every endpoint reports them alike."""

    model_config = _LENIENT

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    sampling: SamplingExtension | None = None

    @field_validator("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "seed", "min_tokens", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected a number, got a boolean")
        return v


class ChatCompletionRequest(_SamplingFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    logprobs: bool | None = None
    top_logprobs: int | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutputOptions | None = None
    user: str | None = None

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _no_bool_count(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected an integer, got a boolean")
        return v

    @property
    def wants_audio(self) -> bool:
        return bool(self.modalities and "audio" in self.modalities)


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` (OpenAI's legacy text completions).

    ``prompt`` is a string, a list of token ids, or a list of either (one choice set per
    prompt). ``logprobs`` is the number of top alternatives per token (0 = only the chosen
    token's logprob).
    """

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = 16
    n: int = 1
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    echo: bool = False
    user: str | None = None

    @field_validator("logprobs", "n", "best_of", "max_tokens", mode="before")
    @classmethod
    def _no_bool_int(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected an integer, got a boolean")
        return v

    @field_validator("prompt", mode="before")
    @classmethod
    def _no_bool_ids(cls, v: Any) -> Any:
        # pydantic reads true as the token id 1: a boolean is no token id (nor a prompt).
        items = v if isinstance(v, list) else [v]
        if any(isinstance(x, bool) or (isinstance(x, list) and any(isinstance(y, bool) for y in x)) for x in items):
            raise ValueError("expected a string or token ids, got a boolean")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice set."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class SpeechRequest(_SamplingFields):
    model: str
    input: str = Field(min_length=1)
    voice: str | None = None
    instructions: str | None = None
    response_format: Literal["wav", "pcm", "flac"] = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)  # OpenAI's range
    stream_format: Literal["audio", "sse"] | None = None
    max_tokens: int | None = None


class TensorJSON(BaseModel):
    """A tensor in JSON: ``data`` is base64 of its raw little-endian bytes."""

    model_config = _STRICT

    dtype: str
    shape: list[int]
    data: str


class GenerateRequest(BaseModel):
    """``POST /v1/generate``: engine inputs by name, as nested lists or ``TensorJSON``."""

    model_config = _STRICT

    model: str
    inputs: dict[str, TensorJSON | list[Any] | int | float]
    sampling: dict[str, Any] | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    signals: list[str] | None = None  # which output signals to return (default: all)
    stream: bool = False
    output_format: Literal["base64", "safetensors"] = "base64"


# ---- responses --------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mstar"
