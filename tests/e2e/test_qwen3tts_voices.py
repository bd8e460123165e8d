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
