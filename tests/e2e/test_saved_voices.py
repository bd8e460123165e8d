"""Saved voices over HTTP on a real toy server: make one (multipart and JSON), list it, speak
with it, delete it; a second server on the same voices directory keeps it; limits and bad
input are 4xx errors naming the field.

The toy's "clone" (``ToyApiAdapter.voice_tensors``) turns a clip's loudness in quarters into
four letters and appends the transcript; a request in that voice speaks them before its
input, so its audio must equal a plain request whose input starts with them."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import ServerProcess
from mstar.client import Client, MstarAPIError
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e

RATE = 16000
LOUDNESS = (0.1, 0.5, 0.9, 0.3)  # RMS per quarter -> letters c, n, x, h
LETTERS = "cnxh"


def clip(seconds: float = 1.0, loudness: tuple[float, ...] = LOUDNESS, fmt: str = "WAV") -> bytes:
    n = int(RATE * seconds) // 4
    sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)  # a square wave: its RMS is its amplitude
    samples = np.concatenate([a * sign for a in loudness]).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, samples, RATE, format=fmt, subtype="FLOAT" if fmt == "WAV" else None)
    return buf.getvalue()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


def serve(start_server: Any, voices_dir: Path) -> ServerProcess:
    return start_server(["--voices-dir", str(voices_dir), "--voice-max-seconds", "2", "--voice-max-bytes", "300000"])


@pytest.fixture(scope="module")
def server(start_server: Any, voices_dir: Path) -> ServerProcess:
    return serve(start_server, voices_dir)


def speech(url: str, input: str, voice: str | None = None) -> bytes:
    body = {"model": "toy", "input": input, "response_format": "pcm", "seed": 11, "max_tokens": 10, "voice": voice}
    resp = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.content


def ws_speech(server: ServerProcess, text: str, voice: str) -> bytes:
    with connect(f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream", proxy=None, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session", "model": "toy", "voice": voice, "seed": 11, "max_tokens": 10}))
        ws.send(json.dumps({"type": "text", "text": text}))
        ws.send(json.dumps({"type": "flush"}))
        pcm = b""
        while True:
            msg = ws.recv(timeout=60)
            if isinstance(msg, bytes):
                pcm += msg
            elif json.loads(msg)["type"] == "flushed":
                return pcm


def listed(url: str) -> dict[str, dict[str, Any]]:
    resp = httpx.get(f"{url}/v1/audio/voices", timeout=10)
    assert resp.status_code == 200
    return {v["name"]: v for v in resp.json()["data"]}


def create_multipart(url: str, name: str, audio: bytes, **fields: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/voices", data={"name": name, **fields}, files={"audio": ("ref.wav", audio, "audio/wav")}, timeout=60)


def error(resp: httpx.Response) -> tuple[int, str | None, str | None]:
    e = resp.json()["error"]
    return resp.status_code, e["param"], e["code"]


def test_names_duplicates_and_limits(server: ServerProcess) -> None:
    url = server.url
    assert create_multipart(url, "dup", clip()).status_code == 201
    assert error(create_multipart(url, "dup", clip())) == (409, "name", "voice_exists")
    assert error(create_multipart(url, "alloy", clip())) == (409, "name", "voice_exists")  # a built-in name
    for bad in ("../etc", ".hidden", "a b", "x" * 65):
        assert error(create_multipart(url, bad, clip())) == (400, "name", "invalid_voice_name")
    assert error(create_multipart(url, "long", clip(seconds=3.0))) == (400, "audio", "audio_too_long")
    assert error(create_multipart(url, "big", clip(seconds=1.9) + b"\0" * 200_000)) == (413, "audio", "audio_too_large")
    big_json = httpx.post(f"{url}/v1/audio/voices", json={"name": "big", "audio": base64.b64encode(b"\0" * 300_001).decode()}, timeout=10)
    assert error(big_json) == (413, "audio", "audio_too_large")
    assert error(create_multipart(url, "junk", b"this is not a wav file")) == (400, "audio", "invalid_audio")
    not_b64 = httpx.post(f"{url}/v1/audio/voices", json={"name": "junk", "audio": "@@@"}, timeout=10)
    assert error(not_b64) == (400, "audio", "invalid_audio")
    no_audio = httpx.post(f"{url}/v1/audio/voices", data={"name": "x"}, timeout=10)
    assert error(no_audio) == (400, "audio", "missing_field")
    no_name = httpx.post(f"{url}/v1/audio/voices", files={"audio": ("a.wav", clip())}, timeout=10)
    assert error(no_name) == (400, "name", "missing_field")
    unknown_model = create_multipart(url, "x", clip(), model="nope")
    assert error(unknown_model) == (404, "model", "model_not_found")
    assert "dup" in listed(url) and not {"long", "big", "junk", "x"} & set(listed(url))


def test_round_trip_and_restart(start_server: Any, server: ServerProcess, voices_dir: Path) -> None:
    """Runs after the limits test (file order): it stops the module's server."""
    made = create_multipart(server.url, "narrator", clip())
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["name"] == "narrator" and body["model"] == "toy" and body["saved"] is True
    assert body["has_transcript"] is False and body["reference_duration_s"] == 1.0 and isinstance(body["created_at"], int)
    json_made = httpx.post(f"{server.url}/v1/audio/voices", json={"name": "host", "audio": base64.b64encode(clip(fmt="FLAC")).decode(), "transcript": "ok "}, timeout=60)
    assert json_made.status_code == 201, json_made.text
    assert json_made.json()["has_transcript"] is True

    voices = listed(server.url)
    assert [n for n in voices if n != "dup"] == ["alloy", "narrator", "host"]  # dup: the limits test's
    assert voices["alloy"]["saved"] is False and voices["alloy"]["default"] is True
    assert voices["host"]["has_transcript"] is True and voices["narrator"]["default"] is False

    # Speaking in the voice == speaking its prefix: the stored tensors reach the adapter.
    narrated = speech(server.url, "Hi.", "narrator")
    assert narrated == speech(server.url, LETTERS + "Hi.")
    assert narrated != speech(server.url, "Hi.")
    hosted = speech(server.url, "Hi.", "host")
    assert hosted == speech(server.url, LETTERS + "ok Hi.")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    assert client.audio.speech.create(model="toy", input="Hi.", voice="narrator", response_format="pcm",
                                      extra_body={"seed": 11, "max_tokens": 10}).content == narrated

    assert ws_speech(server, "Hi.", "narrator") == narrated  # WS speech: sentences in the saved voice too
    with Client(server.url) as sdk:  # mstar.client: the same round trip
        assert sdk.create_voice("sdk", clip(), transcript="ok ", model="toy")["has_transcript"] is True
        assert "sdk" in [v["name"] for v in sdk.voices("toy")]
        assert sdk.speech("Hi.", response_format="pcm", voice="sdk", seed=11, max_tokens=10) == hosted
        sdk.delete_voice("sdk")
        with pytest.raises(MstarAPIError) as err:
            sdk.create_voice("bad name", clip())
        assert (err.value.status, err.value.param) == (400, "name")

    # A second server on the same directory (a restart) lists and speaks the same voices.
    server.stop()
    again = serve(start_server, voices_dir)
    assert [n for n in listed(again.url) if n != "dup"] == ["alloy", "narrator", "host"]
    assert speech(again.url, "Hi.", "narrator") == narrated

    deleted = httpx.delete(f"{again.url}/v1/audio/voices/narrator", timeout=10)
    assert deleted.status_code == 200 and deleted.json() == {"object": "voice.deleted", "id": "narrator", "deleted": True}
    assert [n for n in listed(again.url) if n != "dup"] == ["alloy", "host"]
    assert speech(again.url, "Hi.", "narrator") == speech(again.url, "Hi.")  # an unknown name: the toy ignores it
    gone = httpx.delete(f"{again.url}/v1/audio/voices/narrator", timeout=10)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "voice_not_found"
    assert httpx.delete(f"{again.url}/v1/audio/voices/alloy", timeout=10).status_code == 404  # built in
