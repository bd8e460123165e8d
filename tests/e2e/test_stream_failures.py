"""Failures after a response started streaming: every stream still ends in its protocol
(an error event in OpenAI's shape, then the terminator), the failure is logged with the
request id and the request's cache is freed. Never a dropped connection.

The server runs ``faultytoy`` (tests/fixtures/plugins/faulty): the toy model with a
detokenizer whose final ``flush()`` returns text (like byte-level BPE at a cut word) and a
node that raises after N tokens of a request whose prompt says ``[fail-after=N]``.
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import openai
import pytest
from conftest import with_site

pytestmark = pytest.mark.e2e

MODEL = "faultytoy"


@pytest.fixture(scope="module")
def server(start_server, faulty_site):
    srv = start_server(["--model", MODEL, "--preprocess-workers", "0"], env=with_site(faulty_site))
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat(text: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}


def sse_events(server, path: str, body: dict) -> tuple[str, list[str]]:
    """(request id, every ``data:`` payload) of one streamed response, read to its end."""
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-request-id"], [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def _metric_or_zero(server, name: str, **labels: str) -> float:
    try:
        return server.metric(name, **labels)
    except KeyError:
        return 0.0


def wait_kv_free(server) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.metric("mstar_kv_blocks_used") != 0:
        time.sleep(0.05)
    assert server.metric("mstar_kv_blocks_used") == 0


def test_streamed_chat_keeps_the_final_flush(client):
    """max_tokens cuts a word: the detokenizer's flush returns text at the very end."""
    kw = chat("flush me", max_tokens=16, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and len(text) > 0
    assert not text.endswith(" "), "precondition: the last word is cut, so flush() has text"
    chunks = list(client.chat.completions.create(**kw, stream=True))  # raises on a cut stream
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_streamed_chat_flush_ends_with_done(server):
    _, events = sse_events(server, "/v1/chat/completions", {**chat("flush me", max_tokens=16, ignore_eos=True), "stream": True})
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_node_failure_mid_chat_stream(server, client):
    failed_before = _metric_or_zero(server, "mstar_request_finish_total", reason="error")
    stream = client.chat.completions.create(**chat("hello [fail-after=6]", max_tokens=64, extra_body={"ignore_eos": True}), stream=True)
    seen = []
    with pytest.raises(openai.APIError) as info:
        for c in stream:
            seen.append(c)
    assert not isinstance(info.value, openai.APIConnectionError)
    assert seen and seen[0].choices[0].delta.role == "assistant"
    assert "injected fault after 6 tokens" in info.value.message
    assert "RuntimeError" not in info.value.message  # no Python exception names to clients
    assert info.value.body["type"] == "server_error"
    # The raw stream: the error event, then the terminator.
    rid, events = sse_events(server, "/v1/chat/completions", {**chat("again [fail-after=6]", max_tokens=64, ignore_eos=True), "stream": True})
    assert events[-1] == "[DONE]" and set(json.loads(events[-2])) == {"error"}
    assert json.loads(events[-2])["error"]["code"] == "engine_error"
    assert not any("finish_reason" in e and json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2])
    wait_kv_free(server)
    assert server.metric("mstar_request_finish_total", reason="error") >= failed_before + 2
    assert rid in server.log_tail(400) and "injected fault" in server.log_tail(400)


def test_node_failure_whole_chat_is_500(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(**chat("[fail-after=3]", max_tokens=32, extra_body={"ignore_eos": True}))
    assert "injected fault" in info.value.message and "RuntimeError" not in info.value.message


def test_node_failure_mid_speech_sse(server):
    body = {"model": MODEL, "input": "speak [fail-after=24]", "voice": "alloy", "response_format": "pcm", "max_tokens": 64, "stream_format": "sse"}
    _, events = sse_events(server, "/v1/audio/speech", body)
    parsed = [json.loads(e) for e in events]
    assert [p["type"] for p in parsed[-2:]] == ["error", "speech.audio.done"]
    assert parsed[-1]["finish_reason"] == "error" and "injected fault" in parsed[-2]["error"]["message"]
    deltas = [p for p in parsed if p["type"] == "speech.audio.delta"]
    assert deltas and all(base64.b64decode(d["audio"]) for d in deltas)  # it failed after audio started
    wait_kv_free(server)


def test_node_failure_mid_raw_audio_cuts_the_body(server):
    """Raw audio has no error channel: the body ends incomplete (never a clean short clip)."""
    body = {"model": MODEL, "input": "speak [fail-after=24]", "voice": "alloy", "response_format": "pcm", "max_tokens": 64, "stream_format": "audio"}
    got = b""
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200
        for part in r.iter_bytes():
            got += part
    assert got  # audio had started
    wait_kv_free(server)
    assert server.health().status_code == 200


def test_node_failure_mid_generate_stream(server):
    body = {"model": MODEL, "inputs": {"prompt_ids": [256, *b"[fail-after=5]"]}, "sampling": {"max_tokens": 32, "ignore_eos": True}, "kwargs": {"fail_after": 5}, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=body, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "injected fault" in lines[-2]["error"]["message"]
    assert lines[-1]["finished"] and lines[-1]["finish_reason"] == "error"
    assert any("signal" in line for line in lines[:-2])
    wait_kv_free(server)


def test_still_serving_after_the_failures(client):
    resp = client.chat.completions.create(**chat("fine", max_tokens=4, extra_body={"ignore_eos": True}))
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 4
