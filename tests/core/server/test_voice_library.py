"""The saved-voice library (files, names, persistence) and the reference clip's decoding."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from mstar.api import ApiAdapter, ApiError
from mstar.api.voices import VoiceUpload
from mstar.server.routes_voices import create_voice
from mstar.server.voice_library import VoiceLibrary, check_name

CONFIG = {"hidden_size": 8, "architectures": ["X"]}


def wav_bytes(samples: np.ndarray, rate: int = 16000, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../evil", ".hidden", "a/b", "a\\b", "", "x" * 65, "sp ace", "é", "-lead"])
def test_bad_names_are_400s_naming_the_field(name: str, tmp_path: Path) -> None:
    with pytest.raises(ApiError) as err:
        check_name(name)
    assert (err.value.status, err.value.param) == (400, "name")
    with pytest.raises(ApiError):
        VoiceLibrary(tmp_path, "m", CONFIG).save(name, {"t": torch.zeros(1)}, transcript=None, sample_rate=1, duration_s=1)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_round_trip_persists_across_instances_and_is_keyed_by_config(tmp_path: Path) -> None:
    tensors = {"speaker": torch.randn(16), "codes": torch.randint(0, 99, (5, 4))}
    lib = VoiceLibrary(tmp_path, "m", CONFIG)
    entry = lib.save("my.voice-1", tensors, transcript="hello", sample_rate=24000, duration_s=1.5)
    assert (entry.name, entry.transcript, entry.sample_rate, entry.duration_s) == ("my.voice-1", "hello", 24000, 1.5)
    again = VoiceLibrary(tmp_path, "m", dict(CONFIG))  # a restarted server: same root, same checkpoint
    assert [e.name for e in again.entries()] == ["my.voice-1"]
    loaded = again.load("my.voice-1")
    assert loaded.transcript == "hello" and loaded.tensors.keys() == tensors.keys()
    assert all(torch.equal(loaded.tensors[k], tensors[k]) for k in tensors)
    meta = json.loads((lib.dir / "my.voice-1.json").read_text())
    assert meta["tensors"] == {"speaker": [16], "codes": [5, 4]} and meta["model"] == "m"
    assert VoiceLibrary(tmp_path, "m", {**CONFIG, "hidden_size": 16}).entries() == []  # another checkpoint
    assert VoiceLibrary(tmp_path, "other", CONFIG).entries() == []


def test_duplicates_409_unknown_404_delete_removes_both_files(tmp_path: Path) -> None:
    lib = VoiceLibrary(tmp_path, "m", CONFIG)
    lib.save("v", {"t": torch.ones(2)}, transcript=None, sample_rate=8000, duration_s=0.5)
    with pytest.raises(ApiError) as err:
        lib.save("v", {"t": torch.zeros(2)}, transcript=None, sample_rate=8000, duration_s=0.5)
    assert (err.value.status, err.value.code) == (409, "voice_exists")
    assert torch.equal(lib.load("v").tensors["t"], torch.ones(2))  # the first one is intact
    lib.delete("v")
    assert lib.entries() == [] and list(lib.dir.iterdir()) == []
    for call in (lambda: lib.delete("v"), lambda: lib.load("v")):
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.status == 404


def test_a_voice_missing_a_file_is_not_listed(tmp_path: Path) -> None:
    lib = VoiceLibrary(tmp_path, "m", CONFIG)
    lib.save("a", {"t": torch.ones(1)}, transcript=None, sample_rate=1, duration_s=1)
    lib.save("b", {"t": torch.ones(1)}, transcript=None, sample_rate=1, duration_s=1)
    (lib.dir / "a.safetensors").unlink()
    (lib.dir / "b.json").write_text("")  # another server is still writing it
    assert lib.entries() == [] and lib.get("a") is None


def test_upload_decodes_to_mono_float32_at_the_files_rate() -> None:
    stereo = np.stack([np.linspace(-0.5, 0.5, 800), np.full(800, 0.25)], axis=1).astype(np.float32)
    sample = VoiceUpload(wav_bytes(stereo, 8000, "FLAC"), "hi", 30.0, {"k": "v"}).decode()
    assert sample.sample_rate == 8000 and sample.audio.dtype == np.float32 and sample.audio.shape == (800,)
    np.testing.assert_allclose(sample.audio, stereo.mean(axis=1), atol=1e-4)  # FLAC is 16-bit
    assert (sample.transcript, sample.options, sample.duration_s) == ("hi", {"k": "v"}, 0.1)


@pytest.mark.parametrize(("data", "code"), [
    (b"not audio at all", "invalid_audio"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt ", "invalid_audio"),
    (wav_bytes(np.zeros(0, np.float32)), "invalid_audio"),
    (wav_bytes(np.zeros(16000 * 3, np.float32)), "audio_too_long"),
])
def test_bad_or_too_long_audio_is_a_400_naming_audio(data: bytes, code: str) -> None:
    with pytest.raises(ApiError) as err:
        VoiceUpload(data, None, 2.0).decode()
    assert (err.value.status, err.value.param, err.value.code) == (400, "audio", code)


def test_a_model_that_makes_no_voices_is_a_400(tmp_path: Path) -> None:
    rt = SimpleNamespace(adapter=ApiAdapter(), model_name="m", voices=VoiceLibrary(tmp_path, "m", CONFIG))
    with pytest.raises(ApiError) as err:
        asyncio.run(create_voice(rt, {"name": "v"}, wav_bytes(np.zeros(100, np.float32))))  # type: ignore[arg-type]
    assert (err.value.status, err.value.code) == (400, "voice_cloning_not_supported")


def test_two_servers_saving_one_name_at_once_one_wins(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    libs = [VoiceLibrary(tmp_path, "m", CONFIG) for _ in range(8)]  # as if 8 servers share the directory

    def save(i: int) -> int:
        try:
            libs[i].save("same", {"t": torch.full((4,), float(i))}, transcript=None, sample_rate=1, duration_s=1)
            return i
        except ApiError as exc:
            assert exc.status == 409
            return -1

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(save, range(8)))
    winners = [i for i in results if i >= 0]
    assert len(winners) == 1
    assert torch.equal(libs[0].load("same").tensors["t"], torch.full((4,), float(winners[0])))  # the winner's tensors
