"""``mstar bench``'s parsing of responses and prompt files, on canned HTTP responses."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import pytest
from mstar.bench import BenchRequest, RunOptions, arun, jsonl_requests, random_requests


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def _chunk(content: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def _run(handler, requests: list[BenchRequest], **options) -> list:
    opts = RunOptions("http://bench.test", model="m", transport=httpx.MockTransport(handler), **options)
    return asyncio.run(arun(requests, opts)).records


def test_chat_stream_counts_content_chunks_and_reads_usage() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == "Bearer sk-1"
        body = _sse({"choices": [{"delta": {"role": "assistant"}}]}, _chunk("a"), _chunk("bc"), _chunk(""), USAGE, b"[DONE]")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    (rec,) = _run(handler, [BenchRequest("chat", {"messages": [{"role": "user", "content": "hi"}]})], api_key="sk-1")
    assert rec.ok and rec.error is None
    assert (rec.prompt_tokens, rec.output_tokens) == (7, 3)
    assert len(rec.chunk_times) == 2  # the role-only and empty chunks carry no output
    assert seen[0]["model"] == "m" and seen[0]["stream"] is True
    assert seen[0]["stream_options"] == {"include_usage": True}


def test_chat_stream_error_event_or_missing_done_fails_the_request() -> None:
    def with_error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse(_chunk("a"), {"error": {"message": "engine died"}}, b"[DONE]"))

    def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse(_chunk("a"), USAGE))

    req = [BenchRequest("chat", {"messages": []})]
    (rec,) = _run(with_error, req)
    assert not rec.ok and "engine died" in rec.error
    (rec,) = _run(cut, req)
    assert not rec.ok and "[DONE]" in rec.error


def test_http_error_status_is_recorded_not_raised() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": {"message": "queue full"}})

    recs = _run(handler, [BenchRequest("chat", {"messages": []})] * 3)
    assert [r.ok for r in recs] == [False] * 3
    assert all(r.status == 429 and "queue full" in r.error for r in recs)


def test_speech_raw_and_sse_audio_seconds() -> None:
    pcm = bytes(2 * 1600)  # 1600 samples at 16 kHz = 0.1 s

    def raw(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert (body["response_format"], body["stream_format"]) == ("pcm", "audio")
        return httpx.Response(200, content=pcm, headers={"x-sample-rate": "16000"})

    (rec,) = _run(raw, [BenchRequest("speech", {"input": "hi"})])
    assert rec.ok and rec.audio_seconds == pytest.approx(0.1)

    def sse(request: httpx.Request) -> httpx.Response:
        deltas = [{"type": "speech.audio.delta", "audio": base64.b64encode(pcm[:n]).decode()} for n in (1000, 2200, 3198)]
        return httpx.Response(200, content=_sse(*deltas, {"type": "speech.audio.done", "finish_reason": "length"}), headers={"x-sample-rate": "16000"})

    (rec,) = _run(sse, [BenchRequest("speech", {"input": "hi"})], speech_format="sse")
    assert rec.ok and len(rec.chunk_times) == 3
    assert rec.audio_seconds == pytest.approx((1000 + 2200 + 3198) / 2 / 16000)


def test_random_prompts_are_seeded_and_jsonl_rows_override_fields(tmp_path: Path) -> None:
    a = random_requests("chat", 4, input_words=5, max_tokens=9, seed=3, temperature=0)
    assert a == random_requests("chat", 4, input_words=5, max_tokens=9, seed=3, temperature=0)
    assert a != random_requests("chat", 4, input_words=5, max_tokens=9, seed=4, temperature=0)
    assert all(len(r.body["messages"][0]["content"].split()) == 5 and r.body["max_tokens"] == 9 for r in a)
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one", "voice": "b"}\n\n{"input": "two", "max_tokens": 3}\n')
    reqs = jsonl_requests("speech", path, num=3, max_tokens=8, voice="a")
    assert [r.body for r in reqs] == [
        {"voice": "b", "input": "one", "max_tokens": 8},
        {"voice": "a", "input": "two", "max_tokens": 3},
        {"voice": "b", "input": "one", "max_tokens": 8},
    ]
    path.write_text('{"prompt": "ok"}\n[1]\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected a JSON object"):
        jsonl_requests("chat", path, None, None)


def test_whole_chat_reads_usage_and_has_no_chunk_times() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is False
        return httpx.Response(200, json={"choices": [{"message": {"content": "abc"}}], "usage": USAGE["usage"]})

    (rec,) = _run(handler, [BenchRequest("chat", {"messages": []})], stream=False)
    assert rec.ok and (rec.prompt_tokens, rec.output_tokens) == (7, 3) and rec.chunk_times == []
