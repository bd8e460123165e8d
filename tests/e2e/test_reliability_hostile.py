"""Hostile but valid JSON against real ``mstar serve`` processes on loopback (#33, findings
1, 4 and 9): lone surrogates, deep nesting, overflowing numbers and booleans as token ids
are 400s naming the field; a request that fails after its inputs reached shared memory
leaves no segment, registration or admission slot behind; and a 500 leaves the keep-alive
connection usable."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import time

import httpx
import pytest
from conftest import API_KEY, SHM_DIR, with_site

pytestmark = pytest.mark.e2e

BIG = 16384  # int64 ids: 128 KiB of inputs, over the 64 KiB shared-memory threshold
JSON = {"content-type": "application/json"}


def _segments(server) -> set[str]:
    """This server's shared-memory segments (its prefix: ``mstar_<token>_``)."""
    return {p.name for p in SHM_DIR.glob("mstar_*")} - server.shm_before


def _big_generate(kwargs_json: str) -> bytes:
    ids = json.dumps({"dtype": "int64", "shape": [BIG], "data": base64.b64encode(bytes(BIG * 8)).decode()})
    return f'{{"model": "toy", "inputs": {{"prompt_ids": {ids}}}, "sampling": {{"max_tokens": 2}}, "kwargs": {kwargs_json}}}'.encode()


@pytest.fixture(scope="module")
def toy(start_server):
    return start_server(["--preprocess-workers", "0"])


def test_generate_with_a_lone_surrogate_is_a_400_and_leaves_no_segment(toy) -> None:
    before = _segments(toy)
    with httpx.Client(base_url=toy.url, timeout=30) as client:  # one keep-alive connection
        for _ in range(10):
            r = client.post("/v1/generate", content=_big_generate('{"x": "\\ud800"}'), headers=JSON)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "kwargs.x"
            assert r.json()["error"]["type"] == "invalid_request_error"
        # The same inputs with a fine string reach the engine (through shared memory), which
        # finds the prompt too long for the toy.
        ok = client.post("/v1/generate", content=_big_generate('{"x": "fine"}'), headers=JSON)
        assert ok.status_code == 400 and ok.json()["error"]["code"] == "context_length_exceeded", ok.text
    time.sleep(0.5)
    assert _segments(toy) == before
    assert toy.metric("mstar_running_requests") == 0


DEEP = "[" * 900 + "]" * 900

# (path, body, param): valid JSON every route must answer with a 400 naming the field.
HOSTILE = [
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "stop": "\\ud800"}', "stop"),
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "\\udfff"]}', "stop.1"),
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "x\\udc00y"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "zz": ' + DEEP + "}", "zz"),
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}', None),
    ("/v1/chat/completions", '{"model": "toy", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', "temperature"),
    ("/v1/completions", '{"model": "toy", "prompt": "hi", "stop": "\\ud800"}', "stop"),
    ("/v1/completions", '{"model": "toy", "prompt": [true]}', "prompt"),
    ("/v1/completions", '{"model": "toy", "prompt": [[1, false]]}', "prompt"),
    ("/v1/audio/speech", '{"model": "toy", "input": "hi", "stop": ["\\ud800"]}', "stop.0"),
    ("/v1/audio/speech", '{"model": "toy", "input": "hi", "speed": 1e999}', "speed"),
    ("/v1/audio/speech", '{"model": "toy", "input": "hi", "speed": 100}', "speed"),
    ("/v1/audio/speech", '{"model": "toy", "input": "hi", "zz": {"a": ' + DEEP + "}}", "zz"),
    ("/v1/generate", '{"model": "toy", "inputs": {"prompt_ids": [1, 2]}, "kwargs": {"k": "\\ud800"}}', "kwargs.k"),
    ("/v1/generate", '{"model": "toy", "inputs": {"prompt_ids": [1, 2]}, "kwargs": {"k": ' + DEEP + "}}", "kwargs"),
    ("/v1/generate", '{"model": "toy", "inputs": {"prompt_ids": ' + DEEP + "}}", "inputs"),
    ("/v1/generate", '{"model": "toy", "inputs": {"prompt_ids": [1, 2]}, "zz": "\\ud800"}', "zz"),
]


@pytest.mark.parametrize(("path", "body", "param"), HOSTILE, ids=[f"{p}:{param}" for p, _, param in HOSTILE])
def test_hostile_valid_json_is_a_400_naming_the_field(toy, path: str, body: str, param: str | None) -> None:
    r = httpx.post(toy.url + path, content=body.encode(), headers=JSON, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error


def test_upload_with_a_lone_surrogate_names_the_field(toy) -> None:
    request = '{"model": "toy", "kwargs": {"k": "\\ud800"}}'
    files = {"request": (None, request), "prompt_ids": ("p", b"abc")}
    r = httpx.post(toy.url + "/v1/generate/upload", files=files, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "kwargs.k"


@pytest.fixture(scope="module")
def faulty(start_server, faulty_site):
    return start_server(["--model", "faultytoy", "--preprocess-workers", "0"], env=with_site(faulty_site))


UNSENDABLE = {"model": "faultytoy", "messages": [{"role": "user", "content": "[unsendable] hi"}], "max_tokens": 2}
VALID = {"model": "faultytoy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_request_failing_after_its_inputs_reached_shm_releases_everything(faulty) -> None:
    before = _segments(faulty)
    with httpx.Client(base_url=faulty.url, timeout=30) as client:
        for _ in range(10):
            r = client.post("/v1/chat/completions", json=UNSENDABLE)
            assert r.status_code == 500, r.text
            assert r.json()["error"]["type"] == "server_error"
        assert client.post("/v1/chat/completions", json=VALID).status_code == 200
    time.sleep(0.5)
    assert _segments(faulty) == before, "a failed send left its shared-memory segments"
    assert faulty.metric("mstar_running_requests") == 0


def test_a_500_keeps_the_keep_alive_connection(faulty) -> None:
    host, port = faulty.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for _ in range(3):
            conn.request("POST", "/v1/chat/completions", json.dumps(UNSENDABLE), JSON)
            first = conn.getresponse()
            assert first.status == 500
            first.read()
            sock = conn.sock
            assert sock is not None, "the server closed the connection after its 500"
            conn.request("POST", "/v1/chat/completions", json.dumps(VALID), JSON)  # same socket
            second = conn.getresponse()
            assert second.status == 200, second.read()
            second.read()
            assert conn.sock is sock
    finally:
        conn.close()


def test_the_drain_finds_no_request_left_behind(faulty) -> None:
    """Last in this module: the failed requests above left no registration for the drain
    to end, and the server exits clean (no process, no segment)."""
    assert faulty.stop(signal.SIGTERM) == 0
    log = faulty.log_path.read_text(errors="replace")
    assert "drain timeout: ending" not in log, faulty.log_tail()
    faulty.assert_clean_exit()


def test_health_shows_pids_and_exit_text_only_with_the_key(start_server) -> None:
    server = start_server(["--preprocess-workers", "0"], api_key=API_KEY)
    public = httpx.get(f"{server.url}/health", timeout=10)
    assert public.status_code == 200 and public.json()["status"] == "ok"
    for engine in public.json()["engines"].values():
        assert engine["alive"] is True
        assert not {"pid", "last_exit", "error"} & set(engine), engine
    wrong = httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer wrong"}, timeout=10).json()
    assert all("pid" not in e for e in wrong["engines"].values())
    full = server.health().json()  # with the key
    assert all(isinstance(e["pid"], int) for e in full["engines"].values())


def test_voice_and_ws_messages_with_a_lone_surrogate_name_the_field(toy) -> None:
    from websockets.sync.client import connect

    body = b'{"name": "v1", "transcript": "a\\ud800", "audio": "AAAA"}'
    r = httpx.post(toy.url + "/v1/audio/voices", content=body, headers=JSON, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "transcript"
    with connect(toy.url.replace("http://", "ws://") + "/v1/audio/speech/stream", proxy=None, open_timeout=30) as ws:
        ws.send('{"type": "text", "text": "hi \\ud800"}')
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["error"]["param"] == "text", error
        ws.send('{"type": "session", "temperature": 1e999}')
        assert json.loads(ws.recv(timeout=30))["error"]["param"] == "temperature"
