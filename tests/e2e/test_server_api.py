"""One ``mstar serve`` of the toy model (API key set, small body limit, shared memory used
for audio chunks), driven by the official ``openai`` client and httpx."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

pytestmark = pytest.mark.e2e

API_KEY = "e2e-secret-key"
BODY_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def server(start_server):
    # --shm-threshold 256: audio chunks (>= 320 bytes) cross processes via shared memory.
    srv = start_server(["--max-body-bytes", str(BODY_LIMIT), "--shm-threshold", "256", "--preprocess-workers", "1"], api_key=API_KEY)
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        yield c


def messages(text: str = "Hello there") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# ---- chat ---------------------------------------------------------------------------------


def test_models_and_version(client, http):
    assert [m.id for m in client.models.list().data] == ["toy"]
    v = http.get("/version").json()
    assert v["model"] == "toy" and "chat" in v["endpoints"]


def test_chat_completion(client, http):
    resp = client.chat.completions.create(model="toy", messages=messages(), max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    # The toy's chat prompt is a plain transcript of bytes after BOS: the same tokens
    # through /v1/generate must give the same (greedy) answer.
    prompt = [256, *b"user: Hello there\nassistant:"]
    gen = http.post("/v1/generate", json={"model": "toy", "inputs": {"prompt_ids": prompt}, "sampling": {"temperature": 0, "max_tokens": 12, "ignore_eos": True}, "signals": ["token"]}).json()
    ids = _tensor(gen["outputs"]["token"]).tolist()
    assert choice.message.content == bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    assert resp.usage.completion_tokens == 12 and resp.usage.prompt_tokens == len(prompt)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert isinstance(resp.model_extra["seed"], int)


def test_chat_streaming_equals_whole(client):
    whole = client.chat.completions.create(model="toy", messages=messages(), max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model="toy", messages=messages(), max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_seed_is_reported_and_reproduces(client):
    first = client.chat.completions.create(model="toy", messages=messages("seeded"), max_tokens=16, temperature=1.0)
    seed = first.model_extra["seed"]
    again = client.chat.completions.create(model="toy", messages=messages("seeded"), max_tokens=16, temperature=1.0, seed=seed)
    assert again.model_extra["seed"] == seed
    assert again.choices[0].message.content == first.choices[0].message.content


def test_aux_sampling_extension(http):
    """The toy's audio depends on its residual codes, which the aux sampler ``residual``
    draws: its defaults (temperature 1, top_k 8) make the audio depend on the seed; a greedy
    aux override given in ``sampling.aux`` makes it independent of the seed."""

    def audio(seed: int, aux: dict | None) -> bytes:
        body = {"model": "toy", "messages": messages("aux"), "max_tokens": 12, "temperature": 0, "ignore_eos": True, "seed": seed,
                "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        if aux is not None:
            body["sampling"] = {"aux": aux}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])

    greedy = {"residual": {"temperature": 0}}
    assert audio(1, None) != audio(2, None)
    assert audio(1, greedy) == audio(2, greedy) != audio(1, None)


def test_stop_string_is_applied_and_trimmed(client):
    full = client.chat.completions.create(model="toy", messages=messages(), max_tokens=24, temperature=0).choices[0].message.content
    assert len(full) > 4
    stop = full[3:5]
    cut = client.chat.completions.create(model="toy", messages=messages(), max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_chat_logprobs_greedy_streamed_equals_whole(client):
    kw = {"model": "toy", "messages": messages("logprobs please"), "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens > 0
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes) and entry.token
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely alternative.
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


@pytest.mark.parametrize("top", [0, 20])
def test_chat_top_logprobs_range(client, top):
    resp = client.chat.completions.create(model="toy", messages=messages(), max_tokens=4, temperature=0, logprobs=True, top_logprobs=top)
    content = resp.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == top and e.logprob <= 0 for e in content)


def test_chat_audio_output(client):
    resp = client.chat.completions.create(
        model="toy", messages=messages(), max_tokens=8, temperature=0, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}
    )
    audio = resp.choices[0].message.audio
    data, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    assert rate == 8000 and len(data) > 0 and audio.transcript


# ---- speech ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_speech_file(client, fmt):
    resp = client.audio.speech.create(model="toy", input="Hello world", voice="alloy", response_format=fmt)
    data, rate = sf.read(io.BytesIO(resp.content))
    assert rate == 8000 and data.ndim == 1 and len(data) > 0
    assert np.all(np.abs(data) <= 1.0)


def test_speech_streams_match_whole(http):
    body = {"model": "toy", "input": "Stream me", "response_format": "pcm", "seed": 7, "max_tokens": 24}
    whole = http.post("/v1/audio/speech", json=body).content
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as r:
        streamed = b"".join(r.iter_bytes())
    assert whole and streamed == whole
    deltas = []
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "sse"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                deltas.append(json.loads(line[6:]))
    assert deltas[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(d["audio"]) for d in deltas[:-1]) == whole
    with http.stream("POST", "/v1/audio/speech", json={**body, "response_format": "wav", "stream_format": "audio"}) as r:
        wav = b"".join(r.iter_bytes())
    assert wav[:4] == b"RIFF" and wav[44:] == whole


# ---- native generate -------------------------------------------------------------------------


def test_generate_matches_in_process_engine(http, toy_checkpoint):
    from mstar import Engine

    prompt = [256, *b"native"]
    sampling = {"temperature": 0.9, "seed": 11, "max_tokens": 20}
    body = {"model": "toy", "inputs": {"prompt_ids": prompt}, "sampling": sampling}
    out = http.post("/v1/generate", json=body).json()
    got = {k: _tensor(v) for k, v in out["outputs"].items()}
    assert out["seeds"] == {"lm": 11}
    with Engine.from_model("toy", weights=toy_checkpoint) as engine:
        ref = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor(prompt)}, "sampling": sampling}])[0]
    assert torch.equal(got["token"], ref.cat("token"))
    assert torch.equal(got["audio"], ref.cat("audio"))
    # The same request as safetensors bytes and as an NDJSON stream.
    from safetensors.torch import load

    st = load(http.post("/v1/generate", json={**body, "output_format": "safetensors"}).content)
    assert torch.equal(st["token"], got["token"])
    lines = []
    with http.stream("POST", "/v1/generate", json={**body, "stream": True, "signals": ["token"]}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["finished"] and all(x["signal"] == "token" for x in lines[:-1])
    assert torch.equal(torch.cat([_tensor(x["tensor"]) for x in lines[:-1]]), got["token"])


def test_generate_large_input_through_shared_memory(http):
    # 480 int64 ids = 3840 bytes, over the 256-byte threshold.
    prompt = [256] + [65] * 479
    r = http.post("/v1/generate", json={"model": "toy", "inputs": {"prompt_ids": {"dtype": "int64", "shape": [480], "data": base64.b64encode(np.array(prompt, "<i8").tobytes()).decode()}}, "sampling": {"max_tokens": 4}})
    assert r.status_code == 200, r.text
    assert _tensor(r.json()["outputs"]["token"]).numel() == 4


def _tensor(j: dict) -> torch.Tensor:
    from mstar.api.tensors import tensor_from_json

    return tensor_from_json(j, "x")


# ---- concurrency ---------------------------------------------------------------------------


def test_32_concurrent_streams_equal_alone(server):
    prompts = [f"request number {i} says hi" for i in range(32)]
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)

    async def one(p: str) -> tuple[str, str]:
        stream = await aclient.chat.completions.create(model="toy", messages=messages(p), max_tokens=40, temperature=0, stream=True)
        text, finish = [], None
        async for c in stream:
            if c.choices:
                text.append(c.choices[0].delta.content or "")
                finish = c.choices[0].finish_reason or finish
        return "".join(text), finish

    async def run() -> tuple[list, list]:
        alone = [await one(p) for p in prompts]
        together = await asyncio.gather(*(one(p) for p in prompts))
        await aclient.close()
        return alone, list(together)

    alone, together = asyncio.run(run())
    assert all(finish for _, finish in together)
    assert together == alone


# Toy KV: 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes = 512 bytes per token, so
# 48 blocks of 4 tokens: 192 tokens, room for 3 of the 8 requests below (about 54 each).
PRESSURE = ["--engine-option", "block_size=4", "--engine-option", "kv_budget_bytes=98304",
            "--engine-option", "max_num_batched_tokens=32", "--preprocess-workers", "0"]


@pytest.fixture(scope="module")
def pressured(start_server):
    srv = start_server(PRESSURE)
    yield srv
    assert srv.stop() == 0, srv.log_tail()
    srv.assert_clean_exit()


def test_preemption_under_kv_pressure_changes_no_output(pressured):
    assert pressured.metric("mstar_kv_blocks_total") == 48
    aclient = openai.AsyncOpenAI(base_url=f"{pressured.url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(i: int) -> tuple[str, str | None]:
        resp = await aclient.chat.completions.create(
            model="toy", messages=messages(f"pressure number {i}"), max_tokens=24, temperature=0.8, seed=100 + i, extra_body={"ignore_eos": True}
        )
        return resp.choices[0].message.content, resp.choices[0].finish_reason

    async def run() -> tuple[list, list]:
        alone = [await one(i) for i in range(8)]
        together = await asyncio.gather(*(one(i) for i in range(8)))
        await aclient.close()
        return alone, list(together)

    before = pressured.metric("mstar_engine_preemptions", engine="0")
    alone, together = asyncio.run(run())
    deadline = time.monotonic() + 5  # engine stats arrive every 0.1 s
    while time.monotonic() < deadline and pressured.metric("mstar_engine_preemptions", engine="0") == before:
        time.sleep(0.05)
    assert pressured.metric("mstar_engine_preemptions", engine="0") > before, "no request was preempted: no pressure"
    assert all(finish == "length" for _, finish in alone)
    assert together == alone


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_and_frees_kv(server, http, stream):
    aborted_before = _metric_or_zero(server, "mstar_request_finish_total", reason="abort")
    # 480 tokens take far longer than the client waits (0.25 s) on any CPU.
    body = {"model": "toy", "messages": messages("a long one"), "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break
    else:  # the client gives up while the whole answer is being generated
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body, timeout=0.25)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        used = server.metric("mstar_kv_blocks_used")
        if used == 0 and _metric_or_zero(server, "mstar_request_finish_total", reason="abort") > aborted_before:
            break
        time.sleep(0.05)
    assert server.metric("mstar_kv_blocks_used") == 0
    assert server.metric("mstar_kv_blocks_total") > 0
    # >=: a request an earlier test left behind may be aborted in the same window.
    assert _metric_or_zero(server, "mstar_request_finish_total", reason="abort") >= aborted_before + 1


def _metric_or_zero(server, name: str, **labels: str) -> float:
    try:
        return server.metric(name, **labels)
    except KeyError:
        return 0.0


# ---- errors -------------------------------------------------------------------------------


def _assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "toy", "messages": "hello"}, 400, "messages"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
        ({"model": "toy", "messages": []}, 400, "messages"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "sampling": {"aux": {"nope": {}}}}, 400, "sampling.aux"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, 400, "top_p"),
        ({"model": "toy", "messages": [{"role": "user", "content": "x" * 600}]}, 400, None),
    ],
)
def test_bad_chat_requests(http, body, status, param):
    _assert_error(http.post("/v1/chat/completions", json=body), status, param)


def test_malformed_json(http):
    err = _assert_error(http.post("/v1/chat/completions", content=b'{"model": "toy", "messages": [', headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"]


def test_oversized_body(http):
    big = {"model": "toy", "messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}
    _assert_error(http.post("/v1/chat/completions", json=big), 413)


def test_auth(server):
    body = {"model": "toy", "messages": messages(), "max_tokens": 2}
    _assert_error(httpx.post(f"{server.url}/v1/chat/completions", json=body), 401)
    _assert_error(httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200  # health needs no key


def test_unknown_endpoint_and_bad_generate(http):
    _assert_error(http.get("/v1/nothing"), 404)
    _assert_error(http.post("/v1/generate", json={"model": "toy", "inputs": {}}), 400, "inputs")
    _assert_error(http.post("/v1/generate", json={"model": "toy", "inputs": {"prompt_ids": [1]}, "signals": ["nope"]}), 400, "signals")
    bad = {"model": "toy", "inputs": {"prompt_ids": {"dtype": "int64", "shape": [3], "data": "AAAA"}}}
    _assert_error(http.post("/v1/generate", json=bad), 400, "inputs.prompt_ids")


def test_engine_rejections_are_400(http, client):
    """Input the engine rejects is the client's error (400), not the server's (500)."""
    empty = {"model": "toy", "inputs": {"prompt_ids": {"dtype": "int64", "shape": [0], "data": ""}}}
    err = _assert_error(http.post("/v1/generate", json=empty), 400)
    assert err["type"] == "invalid_request_error" and "prompt is empty" in err["message"]
    # Past the toy's 512 positions: the engine's length check, not the adapter's.
    big = {"model": "toy", "inputs": {"prompt_ids": [256] + [65] * 600}, "sampling": {"max_tokens": 2}}
    err = _assert_error(http.post("/v1/generate", json=big), 400)
    assert err["code"] == "context_length_exceeded" and "512" in err["message"]
    with http.stream("POST", "/v1/generate", json={**big, "stream": True}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-2]["error"]["code"] == "context_length_exceeded"
    assert lines[-1]["finished"] and lines[-1]["finish_reason"] == "error"
    # The chat path's early check answers alike.
    chat = {"model": "toy", "messages": [{"role": "user", "content": "x" * 600}]}
    assert _assert_error(http.post("/v1/chat/completions", json=chat), 400)["code"] == "context_length_exceeded"
    assert client.chat.completions.create(model="toy", messages=messages(), max_tokens=3, extra_body={"ignore_eos": True}).usage.completion_tokens == 3


def test_still_healthy_after_errors(server, client):
    assert server.health().status_code == 200
    assert client.chat.completions.create(model="toy", messages=messages(), max_tokens=3, extra_body={"ignore_eos": True}).usage.completion_tokens == 3
    assert server.metric("mstar_requests_total", endpoint="/v1/chat/completions", status="400") > 0


# ---- mstar.client ---------------------------------------------------------------------------


def test_mstar_client(server, client):
    from mstar.client import Client, MstarAPIError

    with Client(server.url, api_key=API_KEY) as c:
        assert c.models() == ["toy"] and c.health()["healthy"]
        whole = c.chat(messages(), max_tokens=10, temperature=0)
        text = whole["choices"][0]["message"]["content"]
        assert "".join(c.chat_stream(messages(), max_tokens=10, temperature=0)) == text
        wav = c.speech("client speech", seed=1, max_tokens=8)
        assert sf.read(io.BytesIO(wav))[1] == 8000
        pcm = c.speech("client speech", seed=1, max_tokens=8, response_format="pcm")
        assert b"".join(c.speech_stream("client speech", seed=1, max_tokens=8)) == pcm
        out = c.generate({"prompt_ids": torch.tensor([256, 1, 2, 3])}, sampling={"seed": 2, "max_tokens": 5})
        assert out.outputs["token"].shape == (5,) and out.seeds == {"lm": 2}
        streamed = list(c.generate_stream({"prompt_ids": [256, 1, 2, 3]}, sampling={"seed": 2, "max_tokens": 5}, signals=["token"]))
        assert torch.equal(torch.cat([t for _, t in streamed]), out.outputs["token"])
        with pytest.raises(MstarAPIError) as err:
            c.chat(messages(), temperature=-1)
        assert err.value.status == 400 and err.value.param == "temperature"
