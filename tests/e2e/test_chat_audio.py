"""Chat completions with text and audio out (``modalities: ["text", "audio"]``) on one toy
server, driven by the official ``openai`` client: OpenAI's whole and streamed shapes, the
streamed pieces joined equal the whole response, every format holds the same samples,
``sampling.nodes`` reaches the engine, and bad voices / formats / nodes are 400s."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

pytestmark = pytest.mark.e2e

TOY_RATE = 8000
MESSAGES = [{"role": "user", "content": "Speak to me"}]
OPENAI = {"max_tokens": 24, "temperature": 0, "seed": 5, "modalities": ["text", "audio"]}
EXTRA = {"ignore_eos": True}
BODY = {"model": "toy", "messages": MESSAGES, **OPENAI, **EXTRA}


@pytest.fixture(scope="module")
def server(start_server):
    srv = start_server(["--preprocess-workers", "0"])
    yield srv
    assert srv.stop() == 0, srv.log_tail()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def whole(client: openai.OpenAI, fmt: str):
    return client.chat.completions.create(model="toy", messages=MESSAGES, audio={"voice": "alloy", "format": fmt}, **OPENAI, extra_body=EXTRA)


def test_streamed_pieces_equal_the_whole_response(client, http):
    resp = whole(client, "pcm16")
    message = resp.choices[0].message
    assert message.content is None and message.audio.id.startswith("audio-")
    assert message.audio.expires_at == resp.created and message.audio.transcript
    pcm = base64.b64decode(message.audio.data)
    assert len(pcm) > 0 and len(pcm) % 2 == 0

    stream = client.chat.completions.create(
        model="toy", messages=MESSAGES, audio={"voice": "alloy", "format": "pcm16"}, stream=True, **OPENAI, extra_body=EXTRA
    )
    events = []  # ("text", str) / ("audio", bytes) / ("expires", int) / ("finish", str), in arrival order
    for chunk in stream:
        choice = chunk.choices[0]
        assert choice.delta.content is None
        audio = choice.delta.audio
        if audio is not None:
            fields = {k for k, v in audio.model_dump().items() if v is not None}
            assert fields in ({"id", "transcript"}, {"id", "data"}, {"expires_at"}), fields
            if audio.transcript is not None:
                events.append(("text", audio.transcript))
            elif audio.data is not None:
                events.append(("audio", base64.b64decode(audio.data)))
            else:
                events.append(("expires", audio.expires_at))
        if choice.finish_reason is not None:
            events.append(("finish", choice.finish_reason))
    kinds = [k for k, _ in events]
    assert "".join(v for k, v in events if k == "text") == message.audio.transcript
    assert b"".join(v for k, v in events if k == "audio") == pcm
    assert kinds[-2:] == ["expires", "finish"] and events[-1][1] == resp.choices[0].finish_reason
    # The toy's decoder speaks each chunk of codes as it comes: audio arrives between texts.
    first_audio, last_text = kinds.index("audio"), len(kinds) - 1 - kinds[::-1].index("text")
    assert first_audio < last_text

    # The chat-audio response says its sample rate.
    r = http.post("/v1/chat/completions", json={**BODY, "audio": {"format": "pcm16"}})
    assert r.headers["x-sample-rate"] == str(TOY_RATE)
    assert base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"]) == pcm  # the default voice, seeded


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_each_format_holds_the_clip(client, fmt):
    pcm = np.frombuffer(base64.b64decode(whole(client, "pcm16").choices[0].message.audio.data), dtype="<i2")
    blob = base64.b64decode(whole(client, fmt).choices[0].message.audio.data)
    assert base64.b64decode(whole(client, fmt).choices[0].message.audio.data) == blob  # seeded: the same bytes
    data, rate = sf.read(io.BytesIO(blob), dtype="int16")
    assert rate == TOY_RATE
    if fmt in ("wav", "flac"):
        assert np.array_equal(data, pcm)
    else:  # lossy: as long, within a codec frame
        assert abs(len(data) - len(pcm)) <= 2048


def test_sampling_nodes_reach_the_engine(http):
    """The toy's audio comes from codes its aux sampler ``residual`` draws: set greedy
    through ``sampling.nodes.lm.aux`` it gives the same bytes as through ``sampling.aux``,
    and other bytes than the sampled default."""

    def pcm(sampling: dict | None) -> bytes:
        body = {**BODY, "audio": {"format": "pcm16"}, **({"sampling": sampling} if sampling else {})}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])

    greedy = {"residual": {"temperature": 0}}
    assert pcm({"nodes": {"lm": {"aux": greedy}}}) == pcm({"aux": greedy}) != pcm(None)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"audio": {"voice": "nova", "format": "wav"}}, "audio.voice", ["nova", "alloy"]),
        ({"audio": {"voice": "alloy", "format": "aac"}}, "audio.format", ["aac", "wav", "mp3", "flac", "opus", "pcm16"]),
        ({"audio": {"voice": "alloy", "format": "wav"}, "stream": True}, "audio.format", ["pcm16"]),
        ({"sampling": {"nodes": {"talker": {"temperature": 1}}}}, "sampling.nodes.talker", ["lm"]),
        ({"sampling": {"nodes": {"lm": {"aux": {"bogus": {}}}}}}, "sampling.nodes.lm.aux", ["bogus", "residual"]),
        ({"modalities": ["text", "video"]}, "modalities.1", []),
    ],
)
def test_bad_requests_name_the_field(client, body, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="toy", messages=MESSAGES, extra_body={**OPENAI, **EXTRA, **body})
    error = err.value.body
    assert err.value.status_code == 400 and error["param"] == param, error
    assert all(w in error["message"] for w in words), error["message"]
