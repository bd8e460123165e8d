"""``/v1/models`` entries: ``chat_audio`` says whether the chat route would accept
``modalities: ["text", "audio"]`` (the adapter serves chat, has ``chat_audio`` and an
audio signal), so a client (the playground) can offer spoken replies before asking."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mstar.api.adapter import CHAT, GENERATE, SPEECH
from mstar.server.model_set import card


def runtime(endpoints: set[str], chat_audio: bool, audio_signal: str | None) -> SimpleNamespace:
    adapter = SimpleNamespace(
        endpoints=frozenset(endpoints), chat_audio=chat_audio, audio_signal=audio_signal,
        serves=lambda e: e == GENERATE or e in endpoints,
    )
    return SimpleNamespace(model_name="m", created=1, served_names=lambda: {"m", "m2"}, adapter=adapter)


@pytest.mark.parametrize(
    ("endpoints", "chat_audio", "audio_signal", "want"),
    [
        ({CHAT, SPEECH}, True, "audio", True),
        ({CHAT}, False, "audio", False),  # audio out, but not from chat
        ({CHAT}, True, None, False),  # no signal to speak with: the route refuses it
        ({SPEECH}, True, "audio", False),  # no chat at all
    ],
)
def test_card_says_whether_chat_speaks(endpoints: set[str], chat_audio: bool, audio_signal: str | None, want: bool) -> None:
    entry = card(runtime(endpoints, chat_audio, audio_signal))  # type: ignore[arg-type]
    assert entry["chat_audio"] is want
    assert entry["id"] == "m" and entry["aliases"] == ["m2"]
    assert entry["endpoints"] == sorted({*endpoints, GENERATE})
