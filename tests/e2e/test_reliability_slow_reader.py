"""A client that never reads a large streamed response: the server buffers at most
``--max-stream-buffer-bytes`` of its output, then aborts the request and frees its cache,
while the client still holds the connection open."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytestmark = pytest.mark.e2e

LIMIT = 4096


@pytest.fixture(scope="module")
def server(start_server):
    srv = start_server(["--preprocess-workers", "0", "--max-stream-buffer-bytes", str(LIMIT)])
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


def test_a_client_that_never_reads_is_aborted_with_its_cache_freed(server):
    # About 1.3 KB of SSE per token (20 top logprobs) and about 250 bytes of queued
    # tensors per token: the socket buffers fill long before the 480 tokens are done.
    body = json.dumps({"model": "toy", "messages": [{"role": "user", "content": "never read"}], "max_tokens": 480,
                       "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
    sock = socket.socket()
    # A small window and a small segment size: on loopback (MTU 64 KiB) the server's kernel
    # would otherwise take over a megabyte of the response before its writes block.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "its client is not reading" not in server.log_tail(100):
            time.sleep(0.1)
        assert "its client is not reading" in server.log_tail(100), server.log_tail()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (server.metric("mstar_kv_blocks_used") or server.metric("mstar_running_requests")):
            time.sleep(0.05)
        # Aborted in the engine (cache freed) and out of admission while the client, which
        # never read a byte, still holds the connection.
        assert server.metric("mstar_kv_blocks_used") == 0 and server.metric("mstar_running_requests") == 0
    finally:
        sock.close()
