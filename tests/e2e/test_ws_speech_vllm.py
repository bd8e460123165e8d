"""``WS /v1/audio/speech/stream`` spoken to in vLLM-Omni's documented protocol
(``session.config`` / ``input.text`` / ``input.done`` / ``session.close`` →
``audio.start`` / binary PCM / ``audio.done`` / ``session.done``) on a real toy server: a
client written to that protocol gets, per sentence, the PCM ``/v1/audio/speech`` gives for
the same sentence and seed; bad messages are ``error`` messages in vLLM-Omni's shape and the
socket stays usable."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from conftest import API_KEY, ServerProcess
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SETTINGS = {"seed": 7, "max_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(start_server: Any) -> ServerProcess:
    return start_server(api_key=API_KEY)


def open_ws(server: ServerProcess) -> ClientConnection:
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    return connect(url, additional_headers=AUTH, proxy=None, open_timeout=30)


def send(ws: ClientConnection, **message: Any) -> None:
    ws.send(json.dumps(message))


def utterance(ws: ClientConnection, timeout: float = 60) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A vLLM-Omni client's reading of one utterance: per sentence its audio.start, PCM and
    audio.done (frames between a start and its done belong to it), then session.done."""
    sentences: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    deadline = time.monotonic() + timeout
    while True:
        frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(frame, bytes):
            assert current is not None, "audio outside audio.start / audio.done"
            current["pcm"] += frame
            current["frames"] += 1
            continue
        msg = json.loads(frame)
        if msg["type"] == "audio.start":
            assert current is None
            current = {"start": msg, "pcm": b"", "frames": 0}
        elif msg["type"] == "audio.done":
            assert current is not None and msg["sentence_index"] == current["start"]["sentence_index"]
            current["done"] = msg
            sentences.append(current)
            current = None
        elif msg["type"] == "session.done":
            assert current is None
            return sentences, msg
        else:
            raise AssertionError(f"unexpected message {msg}")


def http_pcm(server: ServerProcess, text: str) -> bytes:
    body = {"model": "toy", "input": text, "response_format": "pcm", **SETTINGS}
    resp = httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.content


def test_vllm_omni_client_gets_the_pcm_of_speech(server: ServerProcess) -> None:
    with open_ws(server) as ws:
        send(ws, type="session.config", response_format="pcm", stream_audio=True, **SETTINGS)
        send(ws, type="input.text", text="Hello the")
        send(ws, type="input.text", text="re. How are you? Fine")
        send(ws, type="input.done")
        first, done = utterance(ws)
        # input.done flushes and keeps the socket; the config stays; sentence_index restarts.
        send(ws, type="input.text", text="One more.")
        send(ws, type="input.done")
        second, done2 = utterance(ws)
        # Without stream_audio: each sentence's PCM in one binary frame.
        send(ws, type="session.config", stream_audio=False, **SETTINGS)
        send(ws, type="input.text", text="Whole at once. Twice.")
        send(ws, type="input.done")
        third, done3 = utterance(ws)
        send(ws, type="session.close")
        with pytest.raises(ConnectionClosedOK):
            ws.recv(timeout=30)
    assert [s["start"]["sentence_text"] for s in first] == ["Hello there.", "How are you?", "Fine"]
    assert [s["start"]["sentence_index"] for s in first] == [0, 1, 2]
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    assert [(s["start"]["utterance_index"], s["start"]["sentence_index"]) for s in second] == [(1, 0)]
    assert done2 == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}
    assert done3["total_sentences"] == 2 and [s["frames"] for s in third] == [1, 1]
    for s in first + second + third:
        assert s["start"]["format"] == "pcm" and s["start"]["sample_rate"] == 8000 and s["start"]["seed"] == 7
        assert s["done"]["error"] is False and s["done"]["total_bytes"] == len(s["pcm"]) > 0
        assert s["pcm"] == http_pcm(server, s["start"]["sentence_text"]), s["start"]["sentence_text"]
    assert any(s["frames"] > 1 for s in first), "stream_audio sends PCM as it is generated"


def test_bad_messages_are_errors_in_vllm_omnis_shape(server: ServerProcess) -> None:
    with open_ws(server) as ws:
        send(ws, type="session.config", response_format="wav")
        err = json.loads(ws.recv(timeout=30))
        assert err["type"] == "error" and err["param"] == "response_format" and "pcm" in err["message"]
        send(ws, type="text", text="ours.")  # the first message chose vLLM-Omni's dialect
        err = json.loads(ws.recv(timeout=30))
        assert err["type"] == "error" and "input.text" in err["message"], err
        send(ws, type="input.text", text="Buffered")
        send(ws, type="session.config", voice="nobody")
        err = json.loads(ws.recv(timeout=30))
        assert err["type"] == "error" and "buffered" in err["message"], err
        send(ws, type="session.config.bogus")
        assert json.loads(ws.recv(timeout=30))["param"] == "type"
        # Still usable: the buffered text is spoken on input.done.
        send(ws, type="input.done")
        sentences, done = utterance(ws)
        assert [s["start"]["sentence_text"] for s in sentences] == ["Buffered"] and done["total_sentences"] == 1
