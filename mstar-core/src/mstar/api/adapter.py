"""``ApiAdapter``: how a model meets the HTTP API (implemented by plugins through the
``mstar_api_adapter`` hook).

Core stays model-agnostic: it parses and validates requests, maps OpenAI sampling fields
onto ``SamplingParams``, runs the engines and encodes responses. The adapter says which
endpoints the model serves, turns a request into engine inputs (this runs in the
preprocess pool, so it must be picklable and must not touch devices), and names the output
signals that carry text and audio.

Logprobs (chat ``logprobs`` / ``top_logprobs``), a model-agnostic convention: the sampling
node that can report them emits, per sampled token and beside the token itself, to-client
signals (not persisted) holding

- ``logprob_signal``: the chosen token's logprob, float ``[1]`` per row (``[B, 1]`` as a
  row output), the sampler's raw ``SampleOutput.logprobs``;
- ``top_logprob_ids_signal`` / ``top_logprob_values_signal``: the top-N alternatives, int64
  and float ``[N]`` per row, sorted by value descending; N may exceed what a request asked
  for (the sampler's width is the largest request's), so the server keeps a prefix. Emitted
  only when some request asked for top logprobs.

A value of the text signal and its logprob values come from the same step, so the server
pairs them in order; withhold the logprob signals wherever the token itself is withheld
(e.g. an EOS). The adapter names the signals, renders tokens with ``token_text`` and
``token_bytes``, and sets ``supports_logprobs = True``. The server asks the engines for the
logprob signals only for requests that want them.

Text and audio out of one chat request (``modalities: ["text", "audio"]``), a
model-agnostic convention: the adapter sets ``chat_audio = True``, names ``text_signal``
(token values, read through ``text_decoder``) and ``audio_signal`` (values turned into mono
float32 samples by ``audio_chunk``, at ``sample_rate``), and lists its ``voices()``. The
server checks ``audio.voice`` with ``audio_voice`` and ``audio.format`` against what it can
encode before the request runs; ``chat_inputs`` sees ``request.wants_audio`` and
``request.audio`` and sets the engine inputs / kwargs that make the graph speak (e.g. a
walk that runs only then) in that voice. The server asks the engines for the audio signal
only for such requests, and renders both signals in arrival order: the transcript and the
audio of OpenAI's ``message.audio`` (whole) or ``delta.audio`` (streamed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from mstar.api.errors import ApiError
from mstar.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SpeechRequest,
)
from mstar.api.tensors import tensor_from_json
from mstar.api.transcription import TRANSLATE, TranscriptionRequest
from mstar.api.voices import EngineVoice, SavedVoice, SessionVoice, VoiceSample

CHAT, SPEECH, GENERATE, COMPLETIONS = "chat", "speech", "generate", "completions"
# POST /v1/audio/transcriptions and /v1/audio/translations (both through transcription_inputs).
TRANSCRIPTION, TRANSLATION = "transcription", "translation"
VOICE = "voice"  # making a saved voice (POST /v1/audio/voices; preprocess pool only)


@dataclass
class EngineRequest:
    """What one request becomes: engine inputs by name, request kwargs, and the prompt
    length to report as ``usage.prompt_tokens``.

    Inputs become tensors here, once (an adapter may give lists of ids); from here to the
    engine they only cross process boundaries (``mstar.server.tensor_codec``)."""

    inputs: dict[str, torch.Tensor]
    kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self.inputs = {name: torch.as_tensor(value) for name, value in self.inputs.items()}


@dataclass(frozen=True)
class Voice:
    """One voice a speech model speaks with: ``name`` is what a request's ``voice`` field
    takes; ``languages`` are the values the model accepts for the language it speaks in
    (empty: the model does not say)."""

    name: str
    languages: tuple[str, ...] = ()
    description: str | None = None


class TextDecoder:
    """Turns one request's text-signal values into text deltas (stateful: a token may end
    mid-character). The default reads values as Unicode code points."""

    def decode(self, value: torch.Tensor) -> str:
        return "".join(chr(int(i)) for i in value.reshape(-1).tolist())

    def flush(self) -> str:
        return ""


class ApiAdapter:
    """Base class of a model's API adapter. Override what the model serves."""

    #: Endpoints served besides ``/v1/generate`` (always served): {"chat", "speech",
    #: "completions", "transcription", "translation"}.
    endpoints: ClassVar[frozenset[str]] = frozenset()
    #: The longest upload ``/v1/audio/transcriptions`` and ``/translations`` accept (decoded
    #: duration); longer is a 400 naming ``file``.
    max_audio_seconds: float = 600.0
    #: Output signal carrying text tokens (chat), and audio samples (speech, chat audio).
    text_signal: str | None = None
    audio_signal: str | None = None
    #: Output signal carrying the audio's codec frames (one value per frame), for usage
    #: counts (``/v1/realtime``'s ``output_token_details.audio_tokens``); None: not counted.
    audio_codes_signal: str | None = None
    sample_rate: int | None = None
    #: The node OpenAI sampling fields apply to (default: the first sampling node).
    sampling_node: str | None = None
    #: Whether chat completions can produce audio (``modalities: ["text", "audio"]``; the
    #: module docstring has the convention).
    chat_audio: bool = False
    #: Logprobs for chat (see the module docstring for the signals' convention).
    supports_logprobs: bool = False
    logprob_signal: str | None = None
    top_logprob_ids_signal: str | None = None
    top_logprob_values_signal: str | None = None
    max_n: int = 1
    #: Whether ``POST /v1/audio/voices`` can make voices for this model: then
    #: ``voice_tensors`` and ``speech_inputs_with_voice`` are implemented.
    creates_voices: bool = False

    def serves(self, endpoint: str) -> bool:
        return endpoint == GENERATE or endpoint in self.endpoints

    def voices(self) -> list[Voice]:
        """The voices ``GET /v1/audio/voices`` lists; the first is the one a speech request
        without ``voice`` gets. Default: none listed."""
        return []

    def audio_voice(self, voice: str | None, param: str = "voice") -> str | None:
        """The voice a request with audio output speaks with: ``voice`` when the model lists
        it, the first listed voice when ``voice`` is None; any other name is a 400 (naming
        ``param``) that lists the voices. A model that lists none takes ``voice`` as it is."""
        names = [v.name for v in self.voices()]
        if not names:
            return voice
        if voice is None:
            return names[0]
        if voice not in names:
            raise ApiError(400, f"unknown voice {voice!r}; this model's voices: {', '.join(names)}", param=param, code="unknown_voice")
        return voice

    # ---- requests → engine inputs (preprocess pool) ---------------------------------
    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        raise NotImplementedError

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        raise NotImplementedError

    def voice_tensors(self, sample: VoiceSample) -> dict[str, torch.Tensor] | EngineVoice:
        """A reference clip (+ transcript, + the upload's model-specific ``options``) → the
        tensors a saved voice stores (e.g. a speaker embedding and the clip's codes), computed
        once when the voice is made. Runs in the preprocess pool: load what it needs there
        (once per worker), never on the API process's event loop; or return an
        ``EngineVoice``: the engine request that computes them (e.g. on the model's encoder
        nodes). Errors as in ``speech_inputs`` (``ApiError``, or ``ValueError`` for a 400)."""
        raise NotImplementedError

    def speech_inputs_with_voice(self, request: SpeechRequest, voice: SavedVoice) -> EngineRequest:
        """``speech_inputs`` for a request whose ``voice`` names a saved voice (preprocess pool)."""
        raise NotImplementedError

    def chat_inputs_with_voice(self, request: ChatCompletionRequest, voice: SavedVoice) -> EngineRequest:
        """``chat_inputs`` for a request with audio out whose ``audio.voice`` names a saved
        voice (preprocess pool). Default: a 400 (the model speaks saved voices only in
        ``/v1/audio/speech``)."""
        raise ApiError(400, f"saved voice {voice.name!r}: this model speaks saved voices in /v1/audio/speech only, "
                            "not in chat", param="audio.voice", code="unknown_voice")

    def session_voice(self, request: SpeechRequest) -> SessionVoice | None:
        """The voice a speech session's settings (``request``, its ``input`` a placeholder)
        carry inline, made once for all its sentences (preprocess pool); None: the settings
        carry none and each sentence goes through ``speech_inputs`` as it is. Default: None."""
        return None

    def completion_inputs(self, request: CompletionRequest) -> EngineRequest:
        """One prompt (``request.prompt`` is a string or a list of token ids)."""
        raise NotImplementedError

    def transcription_inputs(self, request: TranscriptionRequest) -> EngineRequest:
        """An upload to transcribe (``request.task == "transcribe"``, in ``request.language``
        when set) or to translate into English (``"translate"``): ``request.audio`` is the
        decoded file, mono float32 at ``request.sample_rate`` (resample to what the model
        takes); ``request.prompt`` is OpenAI's optional context text. The output is read from
        ``text_signal`` through ``text_decoder``, as for chat. Serve it by listing
        ``TRANSCRIPTION`` (and ``TRANSLATION``) in ``endpoints``."""
        raise NotImplementedError

    def generate_inputs(self, request: GenerateRequest) -> EngineRequest:
        """Native inputs: each JSON tensor as it is. ``/v1/generate/upload`` puts each file
        part here under its form name, a 1-D uint8 tensor of the file's bytes: override to
        map or decode such parts into the graph's inputs (e.g. part ``audio`` to
        ``input_features``); the route checks the graph's inputs on what this returns."""
        return EngineRequest({k: tensor_from_json(v, k) for k, v in request.inputs.items()}, dict(request.kwargs))

    # ---- routes of the plugin's own ----------------------------------------------------
    def routes(self) -> list[Any]:
        """``mstar.api.routes.AdapterRoute``s: endpoints of the model's own for what no core
        endpoint expresses. The server mounts them beside its own routes with its API-key
        check, body limit, draining, error shape and request metrics; each handler runs its
        engine requests through ``RouteCall.generate`` / ``stream`` (admission, timeout,
        abort on disconnect). Called once in the API process, before the port opens.
        Default: none."""
        return []

    # ---- engine outputs → responses --------------------------------------------------
    def text_decoder(self) -> TextDecoder:
        return TextDecoder()

    def count_tokens(self, value: torch.Tensor) -> int:
        return int(value.numel())

    def prompt_audio_tokens(self, request: EngineRequest) -> int | None:
        """How many of ``request``'s prompt positions hold audio (placeholders the audio
        encoder fills); None: the model does not say (usage then omits the split)."""
        return None

    def token_text(self, token_id: int) -> str:
        """One token as text, for logprobs (``token`` in OpenAI's shape)."""
        return chr(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes (``bytes`` in OpenAI's shape): what ``token_text`` cannot show
        when a token is part of a character."""
        return self.token_text(token_id).encode("utf-8", errors="surrogatepass")

    def audio_chunk(self, value: torch.Tensor) -> np.ndarray:
        """Mono float32 samples in [-1, 1]."""
        return value.detach().to(torch.float32).reshape(-1).numpy()

    # ---- start-up ------------------------------------------------------------------
    def warmup_request(self) -> ChatCompletionRequest | SpeechRequest | TranscriptionRequest | GenerateRequest | None:
        """A small request the server runs through every engine before opening its port,
        on the first endpoint the model serves of chat, speech, transcription, translation
        (a transcription gets half a second of a quiet 440 Hz tone as a WAV file). None:
        no warm-up (a model serving only ``/v1/generate`` names its own request here)."""
        if CHAT in self.endpoints:
            return ChatCompletionRequest(model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
        if SPEECH in self.endpoints:
            return SpeechRequest(model="", input="Hi", max_tokens=2, temperature=0)
        for endpoint in (TRANSCRIPTION, TRANSLATION):
            if endpoint in self.endpoints:
                task = "translate" if endpoint == TRANSLATION else "transcribe"
                return TranscriptionRequest(model="", task=task, file=_warmup_wav(), max_tokens=2, temperature=0)
        return None


def _warmup_wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    from mstar.api.audio import encode_audio

    t = np.arange(int(seconds * rate), dtype=np.float32) / rate
    return encode_audio((0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, "wav")


def transcription_endpoint(request: TranscriptionRequest) -> str:
    """The endpoint a transcription request is served under (its task's)."""
    return TRANSLATION if request.task == TRANSLATE else TRANSCRIPTION


def not_served(model: str, endpoint: str) -> ApiError:
    return ApiError(404, f"model {model!r} does not serve the {endpoint} endpoint", code="endpoint_not_served")
