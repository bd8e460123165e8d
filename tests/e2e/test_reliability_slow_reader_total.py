"""Several clients that never read: each stays under ``--max-stream-buffer-bytes``, but
together they pass ``--max-stream-buffer-total-bytes``; the server then aborts the request
with the most output waiting (its queued output dropped, its cache freed) until the total
is back under the cap, while those clients still hold their connections open."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytestmark = pytest.mark.e2e

PER_REQUEST = 1 << 20  # never reached: about 250 bytes of queued tensors per token, 480 tokens
TOTAL = 48 << 10
CLIENTS = 3


@pytest.fixture(scope="module")
def server(start_server):
    srv = start_server(["--preprocess-workers", "0", "--max-stream-buffer-bytes", str(PER_REQUEST),
                        "--max-stream-buffer-total-bytes", str(TOTAL)])
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


def _unread_stream(port: int, text: str) -> socket.socket:
    body = json.dumps({"model": "toy", "messages": [{"role": "user", "content": text}], "max_tokens": 480,
                       "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
    sock = socket.socket()
    # A small window and segment size, so the server's writes block early (as in test_reliability_slow_reader).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def test_unread_streams_together_are_capped(server):
    socks = [_unread_stream(server.port, f"never read {i}") for i in range(CLIENTS)]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.log_tail(200).count("over the total cap") < CLIENTS - 1:
            time.sleep(0.1)
        log = server.log_tail(200)
        # Each alone stays under its own cap; together they pass the total, and all but the
        # last one left under it are aborted as slow readers.
        assert "its client is not reading" not in log, log
        assert log.count("over the total cap") >= CLIENTS - 1, log
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (server.metric("mstar_kv_blocks_used") or server.metric("mstar_running_requests")):
            time.sleep(0.05)
        assert server.metric("mstar_kv_blocks_used") == 0 and server.metric("mstar_running_requests") == 0
    finally:
        for sock in socks:
            sock.close()
