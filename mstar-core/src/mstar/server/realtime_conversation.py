"""A realtime session's conversation: its items in order, and the chat messages they make.

The conversation is the prompt of the next response, through the same path as
``/v1/chat/completions``: a user item becomes a user message whose ``input_text`` parts are
``text`` parts and whose ``input_audio`` parts are ``input_audio`` parts holding a 16-bit
24 kHz mono WAV of the audio (the model's preprocessing resamples it, as for an upload);
a user item of text alone becomes a plain string. An assistant item becomes an assistant
message of its text (its transcript, for audio), a system item a system message; the
session's ``instructions`` come first as a system message.
"""

from __future__ import annotations

import base64
import io
import uuid
from dataclasses import dataclass, field
from typing import Any

import soundfile as sf

from mstar.api.errors import ApiError

RATE = 24000  # Hz, PCM16 mono both ways


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def wav_of(pcm: bytes) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, memoryview(pcm).cast("h"), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@dataclass
class Part:
    type: str  # input_text | input_audio | output_text | output_audio
    text: str | None = None
    transcript: str | None = None
    pcm: bytes | None = None  # input audio, kept for the prompt
    samples: int = 0  # output audio sent so far

    def public(self) -> dict[str, Any]:
        """As OpenAI shows it (audio data is never echoed back)."""
        if self.type in ("input_text", "output_text"):
            return {"type": self.type, "text": self.text or ""}
        return {"type": self.type, "transcript": self.transcript}


@dataclass
class Item:
    id: str
    role: str
    parts: list[Part] = field(default_factory=list)
    status: str = "completed"

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role,
                "status": self.status, "content": [p.public() for p in self.parts]}

    def text(self) -> str:
        return "".join(p.text or p.transcript or "" for p in self.parts)


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, item: Item, previous_id: str | None = None) -> str | None:
        """Appends (or inserts after ``previous_id``); the id of the item before it."""
        if any(i.id == item.id for i in self.items):
            raise ApiError(400, f"an item with id {item.id!r} exists already", param="item.id", code="duplicate_item_id")
        if previous_id is None:
            before = self.items[-1].id if self.items else None
            self.items.append(item)
            return before
        self.items.insert(self.index(previous_id, "previous_item_id") + 1, item)
        return previous_id

    def index(self, item_id: str, param: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise ApiError(400, f"no item {item_id!r} in this conversation", param=param, code="item_not_found")

    def messages(self, instructions: str | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            if item.role != "user":
                out.append({"role": item.role, "content": item.text()})
            elif all(p.type == "input_text" for p in item.parts):
                out.append({"role": "user", "content": "".join(p.text or "" for p in item.parts)})
            else:
                out.append({"role": "user", "content": [_chat_part(p) for p in item.parts]})
        return out


def _chat_part(part: Part) -> dict[str, Any]:
    if part.type == "input_audio":
        data = base64.b64encode(wav_of(part.pcm or b"")).decode()
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    return {"type": "text", "text": part.text or ""}


def truncated(text: str, kept: float) -> str:
    """The share ``kept`` (0..1) of a transcript, cut back to a word boundary: what was
    heard of it, assuming the speech follows its text at an even pace."""
    if kept >= 1:
        return text
    cut = text[: int(len(text) * kept)]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 and len(cut) < len(text) else cut
