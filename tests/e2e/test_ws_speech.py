"""``WS /v1/audio/speech/stream`` on a real toy server, driven by the ``websockets`` client:
per-sentence audio equals ``/v1/audio/speech`` for the same sentence and seed, closing the
socket aborts and frees the engine request, bad messages keep the socket usable."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest
from conftest import API_KEY, ServerProcess
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(start_server: Any) -> ServerProcess:
    return start_server(api_key=API_KEY)


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def open_ws(server: ServerProcess) -> ClientConnection:
    return connect(ws_url(server), additional_headers=AUTH, proxy=None, open_timeout=30)


def send(ws: ClientConnection, **message: Any) -> None:
    ws.send(json.dumps(message))


def read_until(ws: ClientConnection, kind: str, timeout: float = 60) -> list[Any]:
    """Every frame (dict for JSON, bytes for audio) up to and including an event of ``kind``."""
    frames: list[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        frames.append(frame if isinstance(frame, bytes) else json.loads(frame))
        if isinstance(frames[-1], dict) and frames[-1]["type"] == kind:
            return frames


def segments(frames: list[Any]) -> list[dict[str, Any]]:
    """Per sentence that started: its start and end events and its PCM, checking the order
    of frames (a sentence that fails before it starts sends only error and end)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for frame in frames:
        if isinstance(frame, bytes):
            assert current is not None, "audio outside a segment"
            current["pcm"] += frame
        elif frame["type"] == "start":
            assert current is None, "a segment started inside another"
            current = {"start": frame, "pcm": b""}
        elif frame["type"] == "end" and current is not None:
            assert frame["segment"] == current["start"]["segment"]
            current["end"] = frame
            out.append(current)
            current = None
        elif frame["type"] in ("end", "error") and "segment" in frame:
            assert current is None, "a failed segment inside another"  # failed before its start
    return out


def http_pcm(server: ServerProcess, text: str, **fields: Any) -> bytes:
    body = {"model": "toy", "input": text, "response_format": "pcm", **fields}
    resp = httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.content


def test_ws_audio_equals_http_speech_per_sentence(server: ServerProcess) -> None:
    settings = {"seed": 7, "max_tokens": 24, "ignore_eos": True}
    with open_ws(server) as ws:
        send(ws, type="session", **settings)
        send(ws, type="text", text="Hello the")
        t_end = time.perf_counter()
        send(ws, type="text", text="re. How are")  # completes the first sentence
        first = ws.recv(timeout=60)
        first_audio_s = None
        frames = [json.loads(first) if isinstance(first, str) else first]
        while not isinstance(frames[-1], bytes):
            frames.append(ws.recv(timeout=60))
        first_audio_s = time.perf_counter() - t_end
        send(ws, type="text", text=" you?\nFine")
        send(ws, type="text", text=" thanks")
        send(ws, type="flush")
        frames += read_until(ws, "flushed")
        # The socket stays usable after a flush.
        send(ws, type="text", text="One more.")
        send(ws, type="flush")
        frames += read_until(ws, "flushed")
    print(f"time to first audio after the first sentence's end: {first_audio_s * 1000:.1f} ms")
    segs = segments(frames)
    texts = [s["start"]["text"] for s in segs]
    assert texts == ["Hello there.", "How are you?", "Fine thanks", "One more."]
    assert [s["start"]["segment"] for s in segs] == [0, 1, 2, 3]
    flushed = [f for f in frames if isinstance(f, dict) and f["type"] == "flushed"]
    assert [f["segments"] for f in flushed] == [3, 4]
    for seg in segs:
        assert seg["start"]["sample_rate"] == 8000 and seg["start"]["encoding"] == "pcm_s16le"
        assert seg["start"]["seed"] == 7
        assert seg["end"]["finish_reason"] == "length"
        assert seg["end"]["samples"] * 2 == len(seg["pcm"]) > 0
        assert seg["pcm"] == http_pcm(server, seg["start"]["text"], **settings), seg["start"]["text"]


def aborts(server: ServerProcess) -> float:
    try:
        return server.metric("mstar_request_finish_total", reason="abort")
    except KeyError:  # none yet
        return 0.0


def test_ws_close_aborts_and_frees_the_request(server: ServerProcess) -> None:
    aborted = aborts(server)
    with open_ws(server) as ws:
        send(ws, type="session", max_tokens=450, ignore_eos=True, seed=1)
        send(ws, type="text", text="A long sentence to abort.")
        send(ws, type="flush")
        while not isinstance(ws.recv(timeout=60), bytes):
            pass
    # Closed after the first audio of a 450-token sentence: aborted, its cache freed.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        freed = server.metric("mstar_running_requests") == 0 and server.metric("mstar_kv_blocks_used") == 0
        if freed and aborts(server) == aborted + 1:
            break
        time.sleep(0.1)
    assert aborts(server) == aborted + 1
    assert server.metric("mstar_running_requests") == 0
    assert server.metric("mstar_kv_blocks_used") == 0


def test_ws_bad_messages_answer_errors_and_keep_the_socket(server: ServerProcess) -> None:
    with open_ws(server) as ws:
        ws.send("{not json")
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "invalid_json"
        send(ws, type="dance")
        assert json.loads(ws.recv(timeout=30))["error"]["param"] == "type"
        send(ws, type="session", temperature=-1)
        assert json.loads(ws.recv(timeout=30))["error"]["param"] == "temperature"
        send(ws, type="session", model="nope")
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "model_not_found"
        send(ws, type="session", input="no")
        assert json.loads(ws.recv(timeout=30))["error"]["param"] == "input"
        # A sentence the model cannot take fails alone: error + end, then the next one runs.
        send(ws, type="session", max_segment_chars=4000, max_tokens=4, seed=3)
        send(ws, type="text", text="x" * 600 + "\nShort one.")
        send(ws, type="flush")
        frames = read_until(ws, "flushed")
    errors = [f for f in frames if isinstance(f, dict) and f["type"] == "error"]
    assert len(errors) == 1 and errors[0]["segment"] == 0
    assert errors[0]["error"]["code"] == "context_length_exceeded"
    ends = [f for f in frames if isinstance(f, dict) and f["type"] == "end"]
    assert [(e["segment"], e["finish_reason"]) for e in ends] == [(0, "error"), (1, "length")]
    (seg,) = segments(frames)
    assert seg["start"]["text"] == "Short one."
    assert seg["pcm"] == http_pcm(server, "Short one.", max_tokens=4, seed=3)


def test_ws_needs_the_api_key(server: ServerProcess) -> None:
    with pytest.raises(InvalidStatus) as info:
        connect(ws_url(server), proxy=None, open_timeout=30)
    assert info.value.response.status_code == 403
    with pytest.raises(InvalidStatus):
        connect(ws_url(server), additional_headers={"Authorization": "Bearer wrong"}, proxy=None, open_timeout=30)


def bearer_protocol(key: str) -> str:
    return "mstar.bearer." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def test_ws_takes_the_key_as_a_subprotocol_for_browsers(server: ServerProcess) -> None:
    with connect(ws_url(server), subprotocols=["mstar.speech", bearer_protocol(API_KEY)], proxy=None, open_timeout=30) as ws:
        assert ws.subprotocol == "mstar.speech"
        send(ws, type="session", max_tokens=4, seed=2)
        send(ws, type="text", text="Key via subprotocol.")
        send(ws, type="flush")
        (seg,) = segments(read_until(ws, "flushed"))
    assert seg["pcm"] == http_pcm(server, "Key via subprotocol.", max_tokens=4, seed=2)
    for bad in (bearer_protocol("wrong"), "mstar.bearer.%%%"):
        with pytest.raises(InvalidStatus) as info:
            connect(ws_url(server), subprotocols=["mstar.speech", bad], proxy=None, open_timeout=30)
        assert info.value.response.status_code == 403


def test_ws_sentences_beyond_the_waiting_limit_fail_alone(server: ServerProcess) -> None:
    from mstar.server.routes_ws_speech import MAX_WAITING

    n = MAX_WAITING + 6
    with open_ws(server) as ws:
        send(ws, type="session", max_tokens=1, seed=4)
        send(ws, type="text", text="".join(f"s{i}\n" for i in range(n)))  # n sentences in one message
        send(ws, type="flush")
        frames = read_until(ws, "flushed", timeout=120)
        # Still serving: the next sentence speaks.
        send(ws, type="text", text="After.")
        send(ws, type="flush")
        after = segments(read_until(ws, "flushed"))
    ends = [f for f in frames if isinstance(f, dict) and f["type"] == "end"]
    assert [e["segment"] for e in ends] == list(range(n))
    refused = [f["segment"] for f in frames if isinstance(f, dict) and f["type"] == "error"]
    assert len(refused) == 6 and all(f["error"]["code"] == "too_many_sentences" for f in frames if isinstance(f, dict) and f["type"] == "error")
    assert len(segments(frames)) == n - 6
    assert [s["start"]["text"] for s in after] == ["After."]
