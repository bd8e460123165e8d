"""The toy's API adapter: chat and speech over its byte-level LM and toy decoder."""

from __future__ import annotations

import codecs
from typing import Any

import numpy as np
import torch
from mstar.api import CHAT, SPEECH, ApiAdapter, ApiError, EngineRequest, TextDecoder, Voice
from mstar.api.protocol import ChatCompletionRequest, SpeechRequest
from mstar.api.voices import SavedVoice, VoiceSample

from mstar_toy.config import BYTE_VOCAB, encode_text
from mstar_toy.lm import LOGPROB, TOP_IDS, TOP_VALUES


class ByteTextDecoder(TextDecoder):
    """Token ids < 256 are UTF-8 bytes; specials (BOS/EOS/PAD) print nothing."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, value: torch.Tensor) -> str:
        ids = [i for i in value.reshape(-1).tolist() if 0 <= i < BYTE_VOCAB]
        return self._utf8.decode(bytes(ids))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class ToyApiAdapter(ApiAdapter):
    endpoints = frozenset({CHAT, SPEECH})
    text_signal = "token"
    audio_signal = "audio"
    sampling_node = "lm"
    chat_audio = True
    supports_logprobs = True
    logprob_signal = LOGPROB
    top_logprob_ids_signal = TOP_IDS
    top_logprob_values_signal = TOP_VALUES
    creates_voices = True

    def __init__(self, config: dict[str, Any]) -> None:
        self.bos_token_id = int(config["bos_token_id"])
        self.sample_rate = int(config["sample_rate"])
        self.max_len = int(config["max_position_embeddings"])
        self.specials = {
            int(config["bos_token_id"]): "<|bos|>",
            int(config["eos_token_id"]): "<|eos|>",
            int(config["pad_token_id"]): "<|pad|>",
        }

    def voices(self) -> list[Voice]:
        # One voice: the toy has no speakers and ignores a request's ``voice`` unless it
        # names a saved voice (``voice_tensors``).
        return [Voice("alloy", description="the toy's only built-in voice; other names are ignored unless they name a saved voice")]

    def _prompt(self, text: str, param: str) -> EngineRequest:
        ids = encode_text(text, self.bos_token_id)
        # An early check (the engine rejects such prompts alike): no trip to the engine,
        # and room for at least one generated token.
        if len(ids) >= self.max_len:
            raise ApiError(
                400, f"the prompt is {len(ids)} tokens; this model holds at most {self.max_len - 1}",
                param=param, code="context_length_exceeded",
            )
        return EngineRequest({"prompt_ids": torch.tensor(ids, dtype=torch.long)}, prompt_tokens=len(ids))

    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        return self._prompt(self._transcript(request), "messages")

    def _transcript(self, request: ChatCompletionRequest) -> str:
        for i, m in enumerate(request.messages):
            if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
                raise ValueError(f"messages[{i}]: the toy model reads text parts only")
        # A plain transcript: the toy has no chat template.
        return "".join(f"{m.role}: {m.text()}\n" for m in request.messages) + "assistant:"

    def speech_inputs(self, request: SpeechRequest) -> EngineRequest:
        return self._prompt(request.input, "input")

    def voice_tensors(self, sample: VoiceSample) -> dict[str, torch.Tensor]:
        """A toy "clone": the clip's loudness in quarters, as four letters (RMS 0 -> 'a',
        each 1/26 one letter up), then its transcript; a request in this voice speaks
        them before its input."""
        quarters = np.array_split(sample.audio.astype(np.float64), 4)
        letters = "".join(chr(ord("a") + min(25, int(26 * np.sqrt(np.mean(q**2))))) if q.size else "a" for q in quarters)
        return {"prefix": torch.tensor(list((letters + (sample.transcript or "")).encode()), dtype=torch.uint8)}

    def speech_inputs_with_voice(self, request: SpeechRequest, voice: SavedVoice) -> EngineRequest:
        prefix = bytes(voice.tensors["prefix"].tolist()).decode()
        return self._prompt(prefix + request.input, "input")

    def chat_inputs_with_voice(self, request: ChatCompletionRequest, voice: SavedVoice) -> EngineRequest:
        """Spoken chat in a saved voice: its prefix opens the transcript, as in speech."""
        return self._prompt(bytes(voice.tensors["prefix"].tolist()).decode() + self._transcript(request), "messages")

    def text_decoder(self) -> TextDecoder:
        return ByteTextDecoder()

    def token_text(self, token_id: int) -> str:
        if 0 <= token_id < BYTE_VOCAB:
            # A byte that is only part of a character shows as "\\xe2"; ``bytes`` has it.
            return bytes([token_id]).decode("utf-8", errors="backslashreplace")
        return self.specials.get(token_id, f"<|{token_id}|>")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if 0 <= token_id < BYTE_VOCAB else self.token_text(token_id).encode()
