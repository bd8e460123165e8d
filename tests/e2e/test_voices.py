"""``GET /v1/audio/voices`` on a real toy server, and the voices the speech plugins list:
every listed voice (and language) is one their speech requests accept, the first is what a
request without ``voice`` gets, and a name they do not list is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import ServerProcess
from mstar.api import ApiError
from mstar.api.protocol import SpeechRequest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(start_server: Any, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    # A voices directory of its own: saved voices elsewhere never reach this listing.
    return start_server(["--voices-dir", str(tmp_path_factory.mktemp("voices"))])


def test_voices_endpoint_lists_the_served_models_voices(server: ServerProcess) -> None:
    resp = httpx.get(f"{server.url}/v1/audio/voices", timeout=10)
    assert resp.status_code == 200
    assert resp.json() == {"object": "list", "data": [{
        "object": "voice", "id": "alloy", "name": "alloy", "model": "toy", "languages": [], "default": True, "saved": False,
        "description": "the toy's only built-in voice; other names are ignored unless they name a saved voice",
    }]}
    assert httpx.get(f"{server.url}/v1/audio/voices", params={"model": "toy-lm"}, timeout=10).json() == resp.json()
    missing = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "nope"}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def speech(voice: str | None = None, **extra: Any) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": "m", "input": "Hello there.", "voice": voice, **extra})


def same_inputs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_orpheus_voices_are_the_ones_it_speaks(tmp_path: Path) -> None:
    from mstar_orpheus.adapter import OrpheusApiAdapter
    from mstar_orpheus.checkpoint import write_checkpoint
    from mstar_orpheus.config import load_config

    ckpt = write_checkpoint(tmp_path / "orpheus")
    adapter = OrpheusApiAdapter(load_config(ckpt), ckpt)
    voices = adapter.voices()
    assert [v.name for v in voices] == ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]
    assert all(v.languages == () for v in voices)  # the checkpoint declares none
    prompts = {v.name: adapter.speech_inputs(speech(v.name)).inputs for v in voices}
    assert same_inputs(adapter.speech_inputs(speech()).inputs, prompts["tara"])  # the first is the default
    assert not same_inputs(prompts["tara"], prompts["leo"])
    with pytest.raises(ApiError) as err:
        adapter.speech_inputs(speech("alloy"))
    assert err.value.param == "voice"


def test_qwen3tts_voices_are_its_speakers_and_languages(tmp_path: Path) -> None:
    from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
    from mstar_qwen3tts.config import load_config
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "qwen3tts")
    adapter = Qwen3TTSApiAdapter(load_config(ckpt), ckpt)
    voices = {v.name: v for v in adapter.voices()}
    assert list(voices) == ["vivian", "ryan", "eric", "dylan"]  # the checkpoint's spk_id order
    assert voices["eric"].description == "dialect: sichuan_dialect" and voices["ryan"].description is None
    for v in voices.values():
        assert v.languages[0] == "auto" and not any("dialect" in lang for lang in v.languages)
        for lang in v.languages:  # each listed language is accepted with each voice
            adapter.speech_inputs(speech(v.name, language=lang))
    assert same_inputs(adapter.speech_inputs(speech()).inputs, adapter.speech_inputs(speech("vivian")).inputs)
    with pytest.raises(ApiError) as err:
        adapter.speech_inputs(speech("tara"))
    assert err.value.param == "voice"
