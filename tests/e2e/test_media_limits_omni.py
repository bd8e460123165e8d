"""Small files that decode to a lot of memory, sent to ``mstar serve --model qwen3omni
--random-weights`` with one preprocess worker: a 6 KB mp4 of 64 blank 720p frames, an 11 KB
one of 240, and four 4.4 KB PNGs of 6000x6000 pixels in one message. Each is a 400 naming
the per-request limit it passes, refused from the sizes the files declare before their pixels
are decoded, and the worker's peak resident memory (``VmHWM`` in ``/proc/<pid>/status``,
reset after a warm-up request) stays within ``GROWTH_MIB`` of what it was before them
(without the limits: +2.0 GiB, +8.5 GiB and +1.1 GiB). Then a small image chat still works."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess, descendants
from hostile_media import blank_mp4, blank_png, data_url, declared_png, declared_wav

pytestmark = pytest.mark.e2e

GROWTH_MIB = 256  # one 6000x6000 image is decoded (then the next one is refused): about 140 MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("media-limits") / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    srv = ServerProcess(["--model", "qwen3omni", "--random-weights", "--preprocess-workers", "1"], log, env=env)
    try:
        srv.start(timeout=480)  # a loaded 2-core machine: the random checkpoint and warm-up take minutes
        yield srv
    finally:
        try:
            srv.stop()
        finally:
            srv.kill_all()


def _worker_pid(srv: ServerProcess) -> int:
    assert srv.proc is not None
    engines = set(srv.engine_pids().values())
    workers = []
    for pid in descendants(srv.proc.pid) - engines:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            workers.append(pid)
    assert len(workers) == 1, workers
    return workers[0]


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _chat(srv: ServerProcess, parts: list[dict]) -> httpx.Response:
    body = {"model": "qwen3omni", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=300)


def _image(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data, "image/png")}}


def test_media_that_declares_too_much_is_refused_before_decoding(server: ServerProcess) -> None:
    import io

    from PIL import Image

    small = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(small, format="PNG")
    assert _chat(server, [_image(small.getvalue())]).status_code == 200  # the worker loads its processor
    pid = _worker_pid(server)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kib(pid, "VmHWM")

    cases = {
        "64 frames": [{"type": "video_url", "video_url": {"url": data_url(blank_mp4(64), "video/mp4")}}],
        "240 frames": [{"type": "video_url", "video_url": {"url": data_url(blank_mp4(240), "video/mp4")}}],
        "4 PNGs": [_image(blank_png(6000))] * 4,
    }
    for name, parts in cases.items():
        r = _chat(server, parts)
        grown = (_status_kib(pid, "VmHWM") - before) / 1024
        print(f"{name}: preprocess worker peak +{grown:.0f} MiB ({r.status_code})")
        assert grown < GROWTH_MIB, (name, grown)
        assert r.status_code == 400, (name, r.status_code, r.text[:500])
        assert "max_request_pixels" in r.json()["error"]["message"], (name, r.text[:500])
    assert _worker_pid(server) == pid  # the same worker: none crashed
    assert _chat(server, [_image(small.getvalue())]).status_code == 200


def test_media_declaring_huge_sizes_is_never_a_5xx(server: ServerProcess) -> None:
    """The fuzz of declared media sizes: headers that claim far more than the bytes hold (or
    absurd rates), in every media slot a chat takes. Each is answered below 500 (a 400, or a
    200 where only the bytes present are read), the one preprocess worker is still the same
    process afterwards, and its peak memory grew by less than ``GROWTH_MIB``."""
    pid = _worker_pid(server)
    wav = lambda data: {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}  # noqa: E731
    cases = {
        "png 100000x100000": [_image(declared_png(100_000, 100_000))],
        "png 1x2^31": [_image(declared_png(1, 2**31 - 1))],
        "png 0x0": [_image(declared_png(0, 0))],
        "png as video": [{"type": "video_url", "video_url": {"url": data_url(declared_png(50_000, 50_000), "video/mp4")}}],
        "wav 10 hours": [wav(declared_wav(36_000))],
        "wav 4 GiB declared at 192 kHz x 8": [wav(declared_wav(1e9, rate=192_000, channels=8))],
        "wav at 2^31 Hz": [wav(declared_wav(1, rate=2**31 - 1))],
        "wav as audio_url": [{"type": "audio_url", "audio_url": {"url": data_url(declared_wav(36_000), "audio/wav")}}],
        "33 small parts": [_image(declared_png(8, 8))] * 33,
    }
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kib(pid, "VmHWM")
    answers = {name: _chat(server, parts) for name, parts in cases.items()}
    print({name: r.status_code for name, r in answers.items()})
    faults = {name: (r.status_code, r.text[:300]) for name, r in answers.items() if r.status_code >= 500}
    assert not faults, faults
    assert _worker_pid(server) == pid
    assert (_status_kib(pid, "VmHWM") - before) / 1024 < GROWTH_MIB  # what the files hold, not what they claim
