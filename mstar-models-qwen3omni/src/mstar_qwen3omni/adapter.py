"""The API adapter: ``/v1/chat/completions`` (and ``/v1/completions``) on the checkpoint's
tokenizer and chat template, with OpenAI content parts ``text``, ``image_url``,
``input_audio``, ``audio_url`` and ``video_url`` through transformers' Qwen3-Omni processor
(``processing.Preprocessor``). A media part that cannot be used is a 400 naming it.

Remote media URLs are refused unless their host is listed in the environment variable
``MSTAR_ALLOWED_MEDIA_DOMAINS`` (comma-separated; a leading dot allows subdomains as
``media.py`` defines). ``use_audio_in_video`` (or vLLM's
``mm_processor_kwargs.use_audio_in_video``) interleaves a video's audio track.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from mstar.api.adapter import EngineRequest
from mstar.api.errors import ApiError
from mstar.api.protocol import ChatCompletionRequest
from mstar.api.text_adapter import TextLMAdapter
from mstar.text.lm import PROMPT

from mstar_qwen3omni.media import MediaLimits

ALLOWED_DOMAINS_ENV = "MSTAR_ALLOWED_MEDIA_DOMAINS"
# Processor tensor -> the media kind whose encoder walk consumes it.
MEDIA_OF_TENSOR = {"input_features": "audio", "pixel_values": "image", "pixel_values_videos": "video"}


def limits_from_env() -> MediaLimits:
    domains = tuple(d.strip() for d in os.environ.get(ALLOWED_DOMAINS_ENV, "").split(",") if d.strip())
    return MediaLimits(allowed_domains=domains)


class OmniChatAdapter(TextLMAdapter):
    def __init__(self, checkpoint_dir: str | Path, text_config: Mapping[str, Any], node: str, limits: MediaLimits) -> None:
        super().__init__(checkpoint_dir, text_config, node=node)
        self.limits = limits
        self._preprocessor: Any = None

    @property
    def preprocessor(self) -> Any:
        if self._preprocessor is None:  # once per process, on the first media request
            from mstar_qwen3omni.processing import Preprocessor

            self._preprocessor = Preprocessor.from_checkpoint(self.checkpoint_dir, self.limits)
        return self._preprocessor

    def chat_inputs(self, request: ChatCompletionRequest) -> EngineRequest:
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        if not any(has_media(m) for m in messages):
            return super().chat_inputs(request)
        extra = request.model_extra or {}
        in_video = extra.get("use_audio_in_video", (extra.get("mm_processor_kwargs") or {}).get("use_audio_in_video", False))
        try:
            out = self.preprocessor(messages, use_audio_in_video=bool(in_video))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        ids = out.input_ids
        if len(ids) >= self.max_len:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this model holds at most {self.max_len - 1}",
                           param="messages", code="context_length_exceeded")
        media = [kind for key, kind in MEDIA_OF_TENSOR.items() if key in out.tensors]
        return EngineRequest({PROMPT: torch.tensor(ids, dtype=torch.long), **out.tensors}, {"media": media}, len(ids))


def has_media(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") != "text" for p in content)
