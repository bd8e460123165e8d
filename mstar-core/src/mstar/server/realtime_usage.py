"""``response.done``'s ``usage`` for ``/v1/realtime``, in OpenAI's ``RealtimeResponseUsage``
shape, from what the engines report (nothing estimated):

- ``input_tokens``: the prompt's length; ``input_token_details.audio_tokens`` the prompt
  positions that hold audio (the adapter's ``prompt_audio_tokens``: e.g. an omni model's
  audio placeholders, one per audio-encoder frame), ``text_tokens`` the rest (the chat template's
  tokens and audio boundary markers included). No split when the adapter does not say.
- ``output_tokens``: ``output_token_details.text_tokens`` (the tokens of the text signal:
  the Thinker's) plus ``audio_tokens`` (codec frames on the adapter's
  ``audio_codes_signal``: e.g. a talker's frames, its codec EOS not counted; 0 for a
  text answer, left out for a spoken one of a model without such a signal).
- ``cached_tokens`` is left out: the engines do not report prefix-cache hits per request.
"""

from __future__ import annotations

from typing import Any

import torch

from mstar.api.adapter import ApiAdapter, EngineRequest


def code_frames(value: torch.Tensor) -> int:
    """Frames in one value of a codes signal: ``[frames, groups]`` (a bare vector: one)."""
    return int(value.shape[0]) if value.dim() > 1 else 1


class AudioTokenCounter:
    """Counts the codec frames of one response's batches."""

    def __init__(self, adapter: ApiAdapter) -> None:
        self.signal = adapter.audio_codes_signal
        self.frames = 0

    def feed(self, batch: list[tuple[str, torch.Tensor]]) -> None:
        self.frames += sum(code_frames(value) for signal, value in batch if signal == self.signal)


def response_usage(adapter: ApiAdapter, request: EngineRequest | None, text_tokens: int, audio_frames: int | None) -> dict[str, Any]:
    """``audio_frames`` None: audio went out uncounted (no codes signal), so it is left out."""
    prompt = request.prompt_tokens if request is not None else 0
    audio_in = adapter.prompt_audio_tokens(request) if request is not None else None
    output = text_tokens + (audio_frames or 0)
    details = {"text_tokens": text_tokens, **({"audio_tokens": audio_frames} if audio_frames is not None else {})}
    usage: dict[str, Any] = {"total_tokens": prompt + output, "input_tokens": prompt, "output_tokens": output,
                             "output_token_details": details}
    if audio_in is not None:
        usage["input_token_details"] = {"text_tokens": prompt - audio_in, "audio_tokens": audio_in}
    return usage
