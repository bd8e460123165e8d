from __future__ import annotations

import msgspec
import pytest
from mstar.server.messages import (
    AbortRequest,
    AddRequest,
    EngineStats,
    Event,
    Events,
    NodeKV,
    Stats,
    TensorMsg,
    command_decoder,
    command_encoder,
    report_decoder,
    report_encoder,
)


def test_commands_roundtrip():
    add = AddRequest("r1", {"ids": TensorMsg("int64", [2], b"\1" * 16)}, {"lm": {"main": {"seed": 3}}}, {"k": 1}, ["token"])
    for cmd in (add, AbortRequest("r1")):
        assert command_decoder.decode(command_encoder.encode(cmd)) == cmd


def test_reports_roundtrip():
    events = Events("0", [Event("r", "token", TensorMsg("int64", [1], b"\0" * 8)), Event("r", finished=True, finish_reason="stop"), Event("q", finished=True, finish_reason="error", error="x", error_type="too_large")])
    stats = Stats("0", EngineStats(1, 2, 3, [NodeKV("lm", 4, 10)]))
    for rep in (events, stats):
        assert report_decoder.decode(report_encoder.encode(rep)) == rep


def test_no_pickle_and_schema_checked():
    with pytest.raises(msgspec.ValidationError):
        command_decoder.decode(msgspec.msgpack.encode({"type": "add", "request_id": 5}))
    with pytest.raises(msgspec.DecodeError):
        command_decoder.decode(b"\x80\x04not msgpack pickle")
