"""Graceful drain on SIGTERM: new requests get a quick 503 (not a refused socket), running
requests may finish for ``--shutdown-timeout`` seconds, then every stream still running ends
with an error event and ``[DONE]``; the server exits 0 without orphans."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e

TIMEOUT_S = 1.5


def _stream(url: str, max_tokens: int, results: list, started: threading.Event) -> None:
    body = {"model": "toy", "messages": [{"role": "user", "content": "drain"}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    events: list[str] = []
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    except httpx.HTTPError as exc:
        events.append(f"transport error: {exc!r}")
    results.append(events)


def test_sigterm_drains_then_ends_streams_with_error_and_done(start_server):
    server = start_server(["--preprocess-workers", "0", "--shutdown-timeout", str(TIMEOUT_S)])
    long_results: list = []
    short_results: list = []
    long_started = [threading.Event() for _ in range(24)]
    threads = [threading.Thread(target=_stream, args=(server.url, 480, long_results, ev)) for ev in long_started]
    short_started = threading.Event()
    threads.append(threading.Thread(target=_stream, args=(server.url, 6, short_results, short_started)))
    for t in threads:
        t.start()
    for ev in [*long_started, short_started]:
        assert ev.wait(60), server.log_tail()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    time.sleep(0.3)
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "late"}]}, timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
    assert int(r.headers["retry-after"]) >= 1
    assert time.monotonic() - t0 < TIMEOUT_S, "the 503 came only after the drain"
    health = httpx.get(f"{server.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "draining"
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    # The short request finished normally during the drain.
    (short,) = short_results
    assert short[-1] == "[DONE]" and json.loads(short[-2])["choices"][0]["finish_reason"] == "length"
    # Every long stream ended in the protocol: finished, or an error event then [DONE].
    cut = 0
    for events in long_results:
        assert events[-1] == "[DONE]", events[-2:]
        last = json.loads(events[-2])
        if "error" in last:
            assert last["error"]["code"] == "server_shutting_down"
            cut += 1
        else:
            assert last["choices"][0]["finish_reason"] == "length"
    assert cut > 0, "no stream outlasted the drain: the test did not test the timeout"
    assert server.stop(timeout=30) == 0, server.log_tail()
    assert time.monotonic() - t0 < TIMEOUT_S + 15
    server.assert_clean_exit()
