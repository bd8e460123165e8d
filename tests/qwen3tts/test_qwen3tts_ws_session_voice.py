"""WS speech with a Base checkpoint, in process (the real session and adapter, a recording
router instead of engines, answering a voice request with the encoders' outputs): a session
whose settings carry ``ref_audio`` encodes the clip once (one encode-only engine request),
and every sentence goes to the engines with the computed clone prompt (no clip features, no
encoder walks), so the encoders run once per session, not once per sentence.
``tests/e2e/test_qwen3tts_voices.py`` checks the audio against /v1/audio/speech."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from mstar.server.preprocess import PreprocessPool
from mstar.server.router import Finished, RequestStream
from mstar.server.routes_ws_speech import speech_stream
from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
from mstar_qwen3tts.config import load_config
from mstar_qwen3tts.plugin import mstar_node_samplers
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import encoded_inputs


class NoHook:
    def mstar_offload_preprocess(self, model_name: str, request: Any) -> None:
        return None


class RecordingRouter:
    """Answers every request with a few samples of audio; keeps what was submitted."""

    def __init__(self, ckpt: Path) -> None:
        self.ckpt = ckpt
        self.submitted: list[tuple[dict[str, torch.Tensor], dict[str, Any]]] = []

    def submit(self, request_id: str, inputs: dict, configs: Any, kwargs: dict, signals: Any) -> RequestStream:
        self.submitted.append((inputs, kwargs))
        stream = RequestStream(request_id, {"0"})
        if kwargs.get("encode_only"):  # making a voice: what the encoder nodes would send
            encoded = encoded_inputs(self.ckpt, inputs)
            for name in signals:
                stream.put(name, encoded[name])
        else:
            stream.put("audio", torch.full((240,), 0.1))
        stream.finish(Finished("stop"))
        return stream

    def abort(self, request_id: str) -> None:
        pass

    def fail(self, request_id: str, fin: Finished) -> None:
        pass


class Counting(Qwen3TTSApiAdapter):
    """Counts the clips prepared in the API process (the pool's share of a clone: features)."""

    encoded = 0

    def _clip_features(self, *args: Any, **kwargs: Any) -> Any:
        Counting.encoded += 1
        return super()._clip_features(*args, **kwargs)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    ckpt = write_checkpoint(tmp_path_factory.mktemp("qwen3tts-base-ws"), kind="base")
    config = load_config(ckpt)
    adapter = Counting(config, ckpt)

    class Admission:
        async def acquire(self) -> None:
            pass

        def release(self) -> None:
            pass

    ignore = SimpleNamespace(labels=lambda *a: SimpleNamespace(inc=lambda: None), observe=lambda *a: None)
    metrics = SimpleNamespace(finished=ignore, rtf=ignore, ttfa=ignore, itl=ignore, ttft=ignore, tokens=ignore)
    return SimpleNamespace(
        model_name="qwen3tts", adapter=adapter, config=SimpleNamespace(api_key=None, request_timeout_s=None),
        preprocess=PreprocessPool("qwen3tts", ckpt, adapter, NoHook(), 0), router=RecordingRouter(ckpt),
        node_samplers=MappingProxyType(mstar_node_samplers(config)), admission=Admission(), metrics=metrics,
        draining=False, healthy=True, served_names=lambda: {"qwen3tts"}, check_model=lambda name: None, voices=None,
    )


def clip() -> str:
    t = np.arange(12000) / 24000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def session(runtime: SimpleNamespace, settings: dict[str, Any], text: str) -> list[dict[str, Any]]:
    app = FastAPI()

    @app.websocket("/ws")
    async def endpoint(websocket: WebSocket) -> None:
        await speech_stream(runtime, websocket)  # type: ignore[arg-type]

    events: list[dict[str, Any]] = []
    with TestClient(app).websocket_connect("/ws") as ws:
        ws.send_text(json.dumps({"type": "session", "model": "qwen3tts", **settings}))
        ws.send_text(json.dumps({"type": "text", "text": text}))
        ws.send_text(json.dumps({"type": "flush"}))
        while not events or events[-1].get("type") != "flushed":
            message = ws.receive()
            if message.get("text"):
                events.append(json.loads(message["text"]))
    return events


@pytest.mark.parametrize("fields", [{"ref_text": "what the clip says"}, {"x_vector_only_mode": True}])
def test_a_session_encodes_its_clip_once(runtime: SimpleNamespace, fields: dict[str, Any]) -> None:
    runtime.router.submitted.clear()
    Counting.encoded = 0
    events = session(runtime, {"ref_audio": clip(), "seed": 3, **fields}, "One sentence. A second one. And a third.")
    assert [e["type"] for e in events if e["type"] in ("start", "error")] == ["start"] * 3, events
    assert Counting.encoded == 1
    # One request makes the voice on the encoder nodes, then one per sentence speaks it.
    assert [kwargs.get("encode_only", False) for _, kwargs in runtime.router.submitted] == [True, False, False, False]
    first = runtime.router.submitted[1][0]
    for inputs, kwargs in runtime.router.submitted[1:]:
        assert "clone_encode" not in kwargs and not {"ref_mel", "ref_wave"} & inputs.keys()  # no encoder walks
        assert torch.equal(inputs["speaker_embed"], first["speaker_embed"]) and torch.equal(inputs["ref_codes"], first["ref_codes"])
    assert (first["ref_codes"].shape[0] == 0) == ("x_vector_only_mode" in fields)


def test_without_a_session_voice_every_sentence_runs_the_encoders(runtime: SimpleNamespace, monkeypatch) -> None:
    """The contrast (what sessions did before): with no session voice, each sentence sends
    its clip's features and runs the encoder walks itself."""
    runtime.router.submitted.clear()
    monkeypatch.setattr(runtime.adapter, "session_voice", lambda request: None)
    events = session(runtime, {"ref_audio": clip(), "seed": 3, "ref_text": "words"}, "One sentence. A second one.")
    assert [e["type"] for e in events if e["type"] in ("start", "error")] == ["start"] * 2, events
    assert [kwargs.get("clone_encode") for _, kwargs in runtime.router.submitted] == ["in_context"] * 2
    assert all("ref_mel" in inputs and "ref_wave" in inputs for inputs, _ in runtime.router.submitted)


def test_a_bad_session_clip_is_an_error_naming_the_field(runtime: SimpleNamespace) -> None:
    runtime.router.submitted.clear()
    events = session(runtime, {"ref_audio": "not base64!!", "ref_text": "words"}, "Hello.")
    assert events[0]["type"] == "error" and events[0]["error"]["param"] == "ref_audio"
