"""The saved-voice routes over several models, in process (no engines: making a voice runs
only the adapter, here inline): ``model`` picks the library, none picks the first model
that makes voices, a model that makes none is a 400, and the listing shows each model's own."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mstar.api import ApiAdapter, ApiError
from mstar.server.preprocess import PreprocessPool
from mstar.server.routes_voices import install_voice_routes, voices
from mstar.server.voice_library import VoiceLibrary
from starlette.responses import JSONResponse


class NoHook:
    def mstar_offload_preprocess(self, model_name: str, request: Any) -> None:
        return None


def runtime(name: str, adapter: ApiAdapter, root: Path, config: dict[str, Any]) -> SimpleNamespace:
    rt = SimpleNamespace(
        model_name=name, adapter=adapter, voices=VoiceLibrary(root, name, config),
        preprocess=PreprocessPool(name, root, adapter, NoHook(), 0),
        config=SimpleNamespace(voice_max_bytes=1 << 20, voice_max_seconds=5.0),
    )
    rt.check_model = lambda model: None
    return rt


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, dict[str, SimpleNamespace]]:
    from mstar_toy.adapter import ToyApiAdapter
    from mstar_toy.checkpoint import write_checkpoint
    from mstar_toy.config import load_config

    config = load_config(write_checkpoint(tmp_path / "toy"))
    models = {
        "plain": runtime("plain", ApiAdapter(), tmp_path / "voices", {"kind": "plain"}),
        "toy-a": runtime("toy-a", ToyApiAdapter(config), tmp_path / "voices", config),
        "toy-b": runtime("toy-b", ToyApiAdapter(config), tmp_path / "voices", config),
    }

    def pick(name: str, scope: Any) -> Any:
        if name not in models:
            raise ApiError(404, f"no model {name!r}", param="model", code="model_not_found")
        return models[name]

    app = FastAPI()
    app.add_exception_handler(ApiError, lambda _, exc: JSONResponse(exc.body(), status_code=exc.status))
    install_voice_routes(app, pick, lambda: list(models.values()))
    return TestClient(app), models


def wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.full(800, 0.5, np.float32), 8000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def post(client: TestClient, name: str, **fields: str) -> Any:
    return client.post("/v1/audio/voices", data={"name": name, **fields}, files={"audio": ("a.wav", wav())})


def test_model_picks_the_library_and_none_picks_the_first_that_makes_voices(served: Any) -> None:
    client, models = served
    made = post(client, "v1")
    assert made.status_code == 201 and made.json()["model"] == "toy-a"
    assert post(client, "v2", model="toy-b").json()["model"] == "toy-b"
    assert post(client, "v1", model="toy-b").status_code == 201  # names are per model
    names = {m: [v["name"] for v in voices(rt, None)["data"] if v["saved"]] for m, rt in models.items()}
    assert names == {"plain": [], "toy-a": ["v1"], "toy-b": ["v2", "v1"]}
    # The toy's "clone" of a constant 0.5 clip: four quarters at RMS 0.5 -> "nnnn".
    assert bytes(models["toy-a"].voices.load("v1").tensors["prefix"].tolist()) == b"nnnn"
    refused = post(client, "v3", model="plain")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "voice_cloning_not_supported"
    assert post(client, "v3", model="nope").status_code == 404
    assert client.delete("/v1/audio/voices/v1", params={"model": "toy-b"}).status_code == 200
    assert [e.name for e in models["toy-b"].voices.entries()] == ["v2"] and models["toy-a"].voices.get("v1") is not None
    assert client.delete("/v1/audio/voices/v1", params={"model": "plain"}).status_code == 404


def test_unknown_options_reach_the_model_and_a_urlencoded_body_without_audio_is_a_400(served: Any) -> None:
    client, models = served
    # The toy takes any options and ignores them; the upload still succeeds.
    assert post(client, "opt", extra="1").status_code == 201
    no_audio = client.post("/v1/audio/voices", data={"name": "x"})
    assert no_audio.status_code == 400 and no_audio.json()["error"]["param"] == "audio"
    plain_text = client.post("/v1/audio/voices", content=b"hello", headers={"content-type": "text/plain"})
    assert plain_text.status_code == 400 and plain_text.json()["error"]["code"] == "invalid_content_type"
