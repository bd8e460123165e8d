"""Failure isolation: a killed engine process fails its in-flight requests promptly and the
server reports unhealthy; SIGINT then shuts everything down without orphans."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(start_server):
    srv = start_server(["--preprocess-workers", "1", "--no-restart-engines"])
    yield srv
    srv.kill_all()


def _stream(url: str, results: list, started: threading.Event) -> None:
    body = {"model": "toy", "messages": [{"role": "user", "content": "go"}], "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        started.set()
    except httpx.HTTPError as exc:
        events.append(f"transport error: {exc}")
    results.append((time.monotonic() - t0, events))


def test_engine_killed_mid_stream(server):
    results: list = []
    started = [threading.Event() for _ in range(4)]
    threads = [threading.Thread(target=_stream, args=(server.url, results, ev)) for ev in started]
    for t in threads:
        t.start()
    for ev in started:
        assert ev.wait(30), server.log_tail()
    killed_at = time.monotonic()
    os.kill(server.engine_pids()["0"], signal.SIGKILL)
    for t in threads:
        t.join(15)
        assert not t.is_alive(), "a stream hung after its engine died"
    assert time.monotonic() - killed_at < 10
    for _, events in results:
        last = [e for e in events if e != "[DONE]"][-1]
        assert "error" in json.loads(last), events[-3:]  # an error event, not a clean finish
    health = server.health()
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "x"}]}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["message"]
    assert server.metric("mstar_engine_up", engine="0") == 0
    # SIGINT (Ctrl-C) still shuts the API process down cleanly.
    assert server.stop(signal.SIGINT) == 0, server.log_tail()
    server.assert_clean_exit()
