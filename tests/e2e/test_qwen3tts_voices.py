"""Saved voices over HTTP with a tiny Qwen3-TTS Base (voice clone) checkpoint: make voices
(in-context with a transcript, and speaker-embedding only), list them, speak with them —
the audio equals the same request with the clip inline as ``ref_audio`` —, and a second
server on the same voices directory lists and speaks them; then delete."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import ServerProcess

pytestmark = pytest.mark.e2e

TRANSCRIPT = "Hello there."


def clip_wav(rate: int = 16000, seconds: float = 1.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 200 * t) * np.linspace(0.2, 1, t.size)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    return {"ckpt": write_checkpoint(tmp_path_factory.mktemp("qwen3tts-base"), kind="base"), "voices": tmp_path_factory.mktemp("voices"),
            "logs": tmp_path_factory.mktemp("logs")}


def start(setup: dict[str, Path], name: str) -> ServerProcess:
    server = ServerProcess(["--model", "qwen3tts", "--weights", str(setup["ckpt"]), "--voices-dir", str(setup["voices"]),
                            "--preprocess-workers", "1"], setup["logs"] / f"{name}.log")
    server.start()
    return server


def speech(url: str, **fields: Any) -> bytes:
    body = {"model": "qwen3tts", "input": "Hi there.", "response_format": "pcm", "seed": 5, "max_tokens": 8, **fields}
    resp = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.content


def saved(url: str) -> list[str]:
    resp = httpx.get(f"{url}/v1/audio/voices", timeout=10)
    assert resp.status_code == 200
    return [v["name"] for v in resp.json()["data"] if v["saved"]]


def test_clone_voices_round_trip_and_restart(setup: dict[str, Path]) -> None:
    wav = clip_wav()
    inline = base64.b64encode(wav).decode()
    first = start(setup, "first")
    try:
        made = httpx.post(f"{first.url}/v1/audio/voices", data={"name": "anna", "transcript": TRANSCRIPT},
                          files={"audio": ("ref.wav", wav, "audio/wav")}, timeout=120)
        assert made.status_code == 201, made.text
        assert made.json()["has_transcript"] is True and made.json()["model"] == "qwen3tts"
        xv = httpx.post(f"{first.url}/v1/audio/voices", json={"name": "anna-xv", "audio": inline}, timeout=120)
        assert xv.status_code == 201, xv.text
        assert saved(first.url) == ["anna", "anna-xv"]

        anna = speech(first.url, voice="anna")
        assert len(anna) > 0
        assert anna == speech(first.url, ref_audio=inline, ref_text=TRANSCRIPT)
        anna_xv = speech(first.url, voice="anna-xv")
        assert anna_xv == speech(first.url, ref_audio=inline, x_vector_only_mode=True)
        assert anna != anna_xv
        with httpx.stream("POST", f"{first.url}/v1/audio/speech", timeout=120, json={
            "model": "qwen3tts", "input": "Hi there.", "response_format": "pcm", "seed": 5, "max_tokens": 8,
            "voice": "anna", "stream_format": "audio"}) as r:
            assert b"".join(r.iter_bytes()) == anna
        mixed = httpx.post(f"{first.url}/v1/audio/speech", json={"model": "qwen3tts", "input": "Hi.", "voice": "anna", "ref_audio": inline}, timeout=60)
        assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "ref_audio"
        no_text = httpx.post(f"{first.url}/v1/audio/voices", data={"name": "x", "x_vector_only_mode": "false"},
                             files={"audio": ("ref.wav", wav)}, timeout=60)
        assert no_text.status_code == 400 and no_text.json()["error"]["param"] == "transcript"
    finally:
        first.stop()

    second = start(setup, "second")  # a restart on the same voices directory
    try:
        assert saved(second.url) == ["anna", "anna-xv"]
        assert speech(second.url, voice="anna") == anna
        assert httpx.delete(f"{second.url}/v1/audio/voices/anna", timeout=10).status_code == 200
        assert saved(second.url) == ["anna-xv"]
        gone = httpx.post(f"{second.url}/v1/audio/speech", json={"model": "qwen3tts", "input": "Hi.", "voice": "anna"}, timeout=60)
        assert gone.status_code == 400 and gone.json()["error"]["param"] == "voice"
    finally:
        second.stop()


def test_ws_session_encodes_its_clip_once(setup: dict[str, Path]) -> None:
    """A WS session with ``ref_audio`` in its settings: the clip becomes the session's voice
    once (one log line for the session, not one per sentence), and every sentence sounds as
    /v1/audio/speech with the clip inline (encoded by the engine's encoder nodes)."""
    import json

    from websockets.sync.client import connect

    inline = base64.b64encode(clip_wav()).decode()
    sentences = ["One sentence here.", "Then a second one.", "And a third."]
    server = start(setup, "ws")
    try:
        url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        pcm: dict[int, bytes] = {}
        with connect(url, proxy=None, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "session", "model": "qwen3tts", "ref_audio": inline, "ref_text": TRANSCRIPT,
                                "seed": 5, "max_tokens": 8}))
            ws.send(json.dumps({"type": "text", "text": " ".join(sentences)}))
            ws.send(json.dumps({"type": "flush"}))
            segment = None
            while True:
                msg = ws.recv(timeout=120)
                if isinstance(msg, bytes):
                    pcm[segment] = pcm.get(segment, b"") + msg
                    continue
                event = json.loads(msg)
                assert event["type"] != "error", event
                if event["type"] == "start":
                    segment = event["segment"]
                if event["type"] == "flushed":
                    break
        assert sorted(pcm) == [0, 1, 2]
        for i, text in enumerate(sentences):
            assert pcm[i] == speech(server.url, input=text, ref_audio=inline, ref_text=TRANSCRIPT), i
        log = server.log_path.read_text()
        assert log.count("made the session's voice once") == 1
    finally:
        server.stop()
