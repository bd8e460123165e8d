"""Qwen3-Omni speaking over HTTP (``mstar serve --model qwen3omni --random-weights``, the tiny
checkpoint with Talker and Code2Wav), driven by the official ``openai`` client: chat with
``modalities: ["text", "audio"]`` whole and streamed, audio that starts before the Thinker's
text ends, seeded bytes alone and under 8 mixed concurrent requests, per-node sampling, text
to speech, and bad voices / formats / labels as 400s."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from omni_server import omni_server

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
# The Thinker writes 12 tokens; the Talker speaks to its codec EOS or 40 frames.
SPEAK = {"max_tokens": 12, "modalities": ["text", "audio"]}
TALKER = {"nodes": {"talker": {"max_tokens": 40}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("qwen3omni-speech-server") / "server.log"
    with omni_server(["--preprocess-workers", "0"], log) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)


def speak(client: openai.OpenAI, fmt: str = "pcm16", voice: str = "Ethan", sampling: dict | None = None, **kw):
    return client.chat.completions.create(
        model="qwen3omni", messages=kw.pop("messages", MESSAGES), audio={"voice": voice, "format": fmt},
        **{"temperature": 0, **SPEAK, **kw}, extra_body={"sampling": sampling or TALKER, "ignore_eos": True},
    )


def pcm_of(resp) -> bytes:
    return base64.b64decode(resp.choices[0].message.audio.data)


def stream_events(client: openai.OpenAI, **kw) -> list[tuple[str, object]]:
    """("text", str) / ("audio", bytes) / ("expires", int) / ("finish", str) in arrival order."""
    events: list[tuple[str, object]] = []
    for chunk in speak(client, stream=True, **kw):
        choice = chunk.choices[0]
        audio = choice.delta.audio
        if audio is not None and audio.transcript is not None:
            events.append(("text", audio.transcript))
        elif audio is not None and audio.data is not None:
            events.append(("audio", base64.b64decode(audio.data)))
        elif audio is not None:
            events.append(("expires", audio.expires_at))
        if choice.finish_reason is not None:
            events.append(("finish", choice.finish_reason))
    return events


def test_voices_are_the_checkpoints_speakers(server):
    voices = httpx.get(f"{server}/v1/audio/voices", timeout=10).json()["data"]
    names = [v["name"] for v in voices]  # the default first, then as config.json lists them
    assert names[0] == "ethan" and voices[0]["default"] and sorted(names) == ["aiden", "chelsie", "ethan"]


def test_streamed_audio_equals_whole_and_starts_before_the_text_ends(client):
    whole = speak(client, seed=11)  # the Talker samples by default: one seed for all three
    message = whole.choices[0].message
    assert message.content is None and message.audio.transcript
    pcm = pcm_of(whole)
    assert len(pcm) > 0
    events = stream_events(client, seed=11)
    kinds = [k for k, _ in events]
    assert "".join(v for k, v in events if k == "text") == message.audio.transcript
    assert b"".join(v for k, v in events if k == "audio") == pcm
    assert kinds[-2:] == ["expires", "finish"]
    # Speech streams while the Thinker writes: the first audio precedes the last text.
    assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text"), kinds
    # The whole response's other containers hold the same samples.
    data, rate = sf.read(io.BytesIO(pcm_of(speak(client, fmt="wav", seed=11))), dtype="int16")
    assert rate == 24000 and data.tobytes() == pcm


def test_seeded_bytes_alone_and_among_eight_mixed_requests(client):
    sampled = {"temperature": 0.9, "seed": 1234}
    alone = speak(client, **sampled)
    assert pcm_of(speak(client, **sampled)) == pcm_of(alone)
    assert pcm_of(speak(client, temperature=0.9, seed=99)) != pcm_of(alone)

    def other(i: int):
        messages = [{"role": "user", "content": f"Request number {i}."}]
        if i % 3 == 0:  # text only
            return client.chat.completions.create(model="qwen3omni", messages=messages, max_tokens=10, temperature=1.0)
        if i % 3 == 1:  # spoken, sampled, another voice
            return speak(client, voice="Chelsie", temperature=1.0, messages=messages)
        return list(stream_events(client, voice="Aiden", temperature=1.0, messages=messages))

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(other, i) for i in range(3)]
        probe = pool.submit(speak, client, **sampled)
        futures += [pool.submit(other, i) for i in range(3, 7)]
        assert all(f.result() is not None for f in futures)
        under_load = probe.result()
    assert pcm_of(under_load) == pcm_of(alone)
    assert under_load.choices[0].message.audio.transcript == alone.choices[0].message.audio.transcript


def test_per_node_sampling_reaches_the_talker(client):
    """Thinker greedy in both; the Talker greedy (main and code predictor) gives the same
    audio for any seed, sampled it depends on the seed."""
    greedy = {"nodes": {"talker": {"max_tokens": 40, "temperature": 0, "aux": {"code_predictor": {"temperature": 0}}}}}
    a, b = (pcm_of(speak(client, seed=s, sampling=greedy)) for s in (1, 2))
    assert a == b
    assert pcm_of(speak(client, seed=1)) != pcm_of(speak(client, seed=2))


def test_text_to_speech_through_the_thinker(client, server):
    body = {"model": "qwen3omni", "input": "Good morning.", "voice": "chelsie", "seed": 5, "max_tokens": 8,
            "response_format": "wav", "sampling": TALKER}
    first = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=300)
    assert first.status_code == 200, first.text
    data, rate = sf.read(io.BytesIO(first.content), dtype="int16")
    assert rate == 24000 and len(data) > 0 and np.abs(data).max() > 0
    assert httpx.post(f"{server}/v1/audio/speech", json=body, timeout=300).content == first.content


@pytest.mark.parametrize(
    ("audio", "sampling", "param"),
    [
        ({"voice": "alloy", "format": "wav"}, None, "audio.voice"),
        ({"voice": "ethan", "format": "aac"}, None, "audio.format"),
        ({"voice": "ethan", "format": "wav"}, {"nodes": {"talker": {"aux": {"residual": {}}}}}, "sampling.nodes.talker.aux"),
        ({"voice": "ethan", "format": "wav"}, {"nodes": {"code2wav": {}}}, "sampling.nodes.code2wav"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(client, audio, sampling, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="qwen3omni", messages=MESSAGES, audio=audio, **SPEAK,
                                       extra_body={"sampling": sampling} if sampling else None)
    assert err.value.body["param"] == param, err.value.body
