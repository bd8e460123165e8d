"""``ending_with_error``: a body that raises after the stream started ends in its framing."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from mstar.api.errors import ApiError
from mstar.server.streaming import ending_with_error


def _frames(exc: ApiError) -> list[bytes]:
    return [f"error {exc.status} {exc.message}".encode(), b"END"]


def _collect(body) -> list[bytes]:
    async def run() -> list[bytes]:
        return [part async for part in body]

    return asyncio.run(run())


async def _body(fault: BaseException | None):
    yield b"first"
    if fault is not None:
        raise fault
    yield b"last"


def test_a_clean_body_passes_unchanged():
    ex = SimpleNamespace(request_id="req-1", finish_reason="length")
    assert _collect(ending_with_error(_body(None), ex, _frames)) == [b"first", b"last"]
    assert ex.finish_reason == "length"


def test_an_api_error_becomes_its_error_frames():
    ex = SimpleNamespace(request_id="req-2", finish_reason=None)
    out = _collect(ending_with_error(_body(ApiError(503, "engine down")), ex, _frames))
    assert out == [b"first", b"error 503 engine down", b"END"]
    assert ex.finish_reason == "error"


def test_a_bug_becomes_a_500_naming_the_request_and_is_logged(caplog):
    ex = SimpleNamespace(request_id="req-3", finish_reason="length")
    with caplog.at_level(logging.ERROR, logger="mstar.server"):
        out = _collect(ending_with_error(_body(TypeError("can't concat dict to bytes")), ex, _frames))
    assert out[0] == b"first" and out[-1] == b"END"
    assert out[1].startswith(b"error 500 ") and b"req-3" in out[1]
    assert b"TypeError" not in out[1] and b"concat" not in out[1]  # details stay in the log
    assert ex.finish_reason == "error"
    assert "req-3" in caplog.text and "can't concat dict to bytes" in caplog.text


def test_cancellation_is_not_swallowed():
    ex = SimpleNamespace(request_id="req-4", finish_reason=None)
    with pytest.raises(asyncio.CancelledError):
        _collect(ending_with_error(_body(asyncio.CancelledError()), ex, _frames))
