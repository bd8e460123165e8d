"""``WS /v1/realtime`` (OpenAI's Realtime API) on ``mstar serve --model qwen3omni`` with the
tiny random checkpoint, driven by the official ``openai`` client's realtime connection: a
spoken turn (and a second, text turn on top of it) answered with the transcript and audio
``/v1/chat/completions`` gives for the same conversation and seed; text items answered in
text; ``response.cancel`` frees every KV block at once; ``server_vad`` finds the turn's end
in a clip with silence and answers; bad events are ``error`` events on a socket that stays;
the API key; idle sessions closed (after ``--realtime-idle-timeout``). ``response.done``'s
usage counts the prompt's audio placeholders and the Talker's codec frames; input audio
transcription gives what ``/v1/audio/transcriptions`` gives; GA's ``conversation.item.added``
/ ``.done`` come where OpenAI sends them. Every server event is validated against the
``openai`` package's ``RealtimeServerEvent`` types."""

from __future__ import annotations

import base64
import io
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from mstar.server.realtime_conversation import truncated
from omni_server import omni_server
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.e2e

KEY = "realtime-test-key"
IDLE_S = 10
RATE = 24000
TALKER = {"nodes": {"talker": {"max_tokens": 40}}}
SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
SEEN: set[str] = set()  # event types received, each validated against the openai package


@pytest.fixture(scope="module")
def server(omni_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("qwen3omni-realtime") / "server.log"
    # The option wins over the environment variable (which would keep idle sessions 15 min).
    env = {"MSTAR_REALTIME_IDLE_S": "900", "MSTAR_MAX_MEDIA_AUDIO_SECONDS": "20"}
    args = ["--preprocess-workers", "0", "--api-key", KEY, "--realtime-idle-timeout", str(IDLE_S)]
    with omni_server(args, log, env=env, weights=omni_ckpt) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


def vowel(seconds: float, f0: float = 120.0) -> np.ndarray:
    """A voiced, speech-like sound: a jittered pulse train through three formant
    resonators, in syllables (4 Hz), float32 at 24 kHz."""
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    phase = np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / RATE
    y = np.diff(np.floor(phase), prepend=0.0)
    for freq, bw in ((700, 80), (1220, 90), (2600, 120)):
        r, th = np.exp(-np.pi * bw / RATE), 2 * np.pi * freq / RATE
        a1, a2, out, y1, y2 = -2 * r * np.cos(th), r * r, np.zeros(n), 0.0, 0.0
        for i in range(n):
            y1, y2 = (1 - r) * y[i] - a1 * y1 - a2 * y2, y1
            out[i] = y1
        y = out
    y *= 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    return (0.5 * y / np.abs(y).max()).astype(np.float32)


def pcm16(wave: np.ndarray) -> bytes:
    return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()


def wav_b64(pcm: bytes) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.frombuffer(pcm, "<i2"), RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


TURN = pcm16(np.concatenate([np.zeros(RATE // 5, np.float32), vowel(1.0)]))


def recv(conn: Any, timeout: float = 300) -> dict[str, Any]:
    """The next server event as sent, after checking it against the openai package's types."""
    raw = conn.recv_bytes() if hasattr(conn, "recv_bytes") else conn.recv(timeout=timeout)
    event = json.loads(raw)
    SERVER_EVENT.validate_python(event)
    SEEN.add(event["type"])
    return event


def until(conn: Any, kind: str) -> list[dict[str, Any]]:
    events = [recv(conn)]
    while events[-1]["type"] != kind:
        events.append(recv(conn))
    return events


def answer(conn: Any, **response: Any) -> dict[str, Any]:
    """``response.create``, then its events: transcript/text, audio, ``response.done``, and
    the seconds to the first audio delta."""
    start = time.perf_counter()
    conn.send({"type": "response.create", **({"response": response} if response else {})})
    out: dict[str, Any] = {"transcript": "", "text": "", "audio": b"", "first_audio_s": None, "types": []}
    while True:
        event = recv(conn)
        kind = event["type"]
        out["types"].append(kind)
        if kind == "response.output_audio.delta":
            out["audio"] += base64.b64decode(event["delta"])
            if out["first_audio_s"] is None:
                out["first_audio_s"] = time.perf_counter() - start
        elif kind == "response.output_audio_transcript.delta":
            out["transcript"] += event["delta"]
        elif kind == "response.output_text.delta":
            out["text"] += event["delta"]
        elif kind == "response.done":
            out["done"] = event["response"]
            return out


def configure(conn: Any, **session: Any) -> dict[str, Any]:
    assert recv(conn)["type"] == "session.created"
    update = {"type": "session.update", "session": {"type": "realtime", **session}}
    conn.send(update if hasattr(conn, "recv_bytes") else json.dumps(update))  # the openai client, or raw websockets
    updated = recv(conn)
    assert updated["type"] == "session.updated", updated
    return updated["session"]


def chat_stream(client: openai.OpenAI, messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    start = time.perf_counter()
    out: dict[str, Any] = {"transcript": "", "audio": b"", "first_audio_s": None}
    for chunk in client.chat.completions.create(
        model="qwen3omni", messages=messages, modalities=["text", "audio"], audio={"voice": "Ethan", "format": "pcm16"},
        max_tokens=12, seed=seed, stream=True, extra_body={"sampling": TALKER, "ignore_eos": True},
    ):
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio is not None and audio.transcript is not None:
            out["transcript"] += audio.transcript
        elif audio is not None and audio.data is not None:
            out["audio"] += base64.b64decode(audio.data)
            if out["first_audio_s"] is None:
                out["first_audio_s"] = time.perf_counter() - start
    return out


SPOKEN = {"seed": 11, "ignore_eos": True, "sampling": TALKER, "max_output_tokens": 12, "audio": {"input": {"turn_detection": None}}}


MESSAGES = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav_b64(TURN), "format": "wav"}}]}]


def test_spoken_turns_equal_chat_completions(client: openai.OpenAI) -> None:
    chat_stream(client, MESSAGES, 11)  # warm: the first audio upload loads the model's audio processor
    with client.realtime.connect(model="qwen3omni") as conn:
        session = configure(conn, **SPOKEN)
        assert session["output_modalities"] == ["audio"] and session["audio"]["output"]["voice"].lower() == "ethan"
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN[: len(TURN) // 2]).decode()})
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN[len(TURN) // 2 :]).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        committed, created, added, done = (recv(conn) for _ in range(4))
        assert committed["type"] == "input_audio_buffer.committed" and created["type"] == "conversation.item.created"
        assert added["type"] == "conversation.item.added" and done["type"] == "conversation.item.done" and done["item"] == created["item"]
        assert created["item"]["id"] == committed["item_id"] and created["item"]["content"][0]["type"] == "input_audio"
        first = answer(conn)
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "And the sky?"}]}})
        assert recv(conn)["type"] == "conversation.item.created"
        second = answer(conn)
    # 12 tokens (EOS ignored): ended by max_output_tokens, as OpenAI reports it.
    assert first["done"]["status"] == "incomplete" and first["done"]["status_details"]["reason"] == "max_output_tokens"
    assert first["done"]["seed"] == 11
    assert first["done"]["usage"]["output_token_details"]["text_tokens"] == 12 and first["done"]["usage"]["input_tokens"] > 0
    assert first["transcript"] and first["audio"] and not first["text"]
    assert first["types"][:5] == ["response.created", "response.output_item.added", "conversation.item.created", "conversation.item.added",
                                  "response.content_part.added"]
    assert first["types"][-6:] == ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
                                   "conversation.item.done", "response.output_item.done", "response.done"]
    chat = chat_stream(client, MESSAGES, 11)
    assert first["transcript"] == chat["transcript"] and first["audio"] == chat["audio"]
    # The conversation (the spoken turn, the answer's transcript, the text) is the prompt.
    messages = MESSAGES + [{"role": "assistant", "content": first["transcript"]}, {"role": "user", "content": "And the sky?"}]
    chat2 = chat_stream(client, messages, 11)
    assert second["transcript"] == chat2["transcript"] and second["audio"] == chat2["audio"]
    ratio = first["first_audio_s"] / chat["first_audio_s"]
    print(f"time to first audio: realtime {first['first_audio_s'] * 1000:.0f} ms, streamed chat "
          f"{chat['first_audio_s'] * 1000:.0f} ms, ratio {ratio:.2f}")


def test_text_items_answered_in_text(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, output_modalities=["text"], instructions="Be brief.", seed=5, temperature=0.9, max_output_tokens=10,
                  audio={"input": {"turn_detection": None}})
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Tell me about the sea."}]}})
        assert recv(conn)["type"] == "conversation.item.created"
        got = answer(conn)
    assert got["text"] and not got["audio"] and "response.output_text.done" in got["types"]
    assert got["done"]["output"][0]["content"][0] == {"type": "output_text", "text": got["text"]}
    chat = client.chat.completions.create(model="qwen3omni", seed=5, temperature=0.9, max_tokens=10, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about the sea."}])
    assert got["text"] == chat.choices[0].message.content


def prompt_counts(ckpt: Path, samples_24k: int) -> tuple[int, int]:
    """(prompt length, audio placeholders) of one user turn holding ``samples_24k`` samples,
    by transformers' Qwen3-Omni processor: the audio is featurised at 16 kHz, so the clip is
    a silent one of the resampled length (the count depends on the length alone)."""
    from mstar_qwen3omni.processing import build_hf_processor

    processor = build_hf_processor(ckpt)
    chat = [{"role": "user", "content": [{"type": "audio"}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    rate = processor.feature_extractor.sampling_rate
    ids = processor(text=[text], audio=[np.zeros(samples_24k * rate // RATE, np.float32)], return_tensors="pt")["input_ids"][0]
    return len(ids), int((ids == processor.tokenizer.convert_tokens_to_ids(processor.audio_token)).sum())


def codec_frames(ckpt: Path, samples: int) -> int:
    """Talker frames behind ``samples`` of Code2Wav audio: each frame is upsampled by the
    product of the checkpoint's rates, less a trim shorter than one frame."""
    cfg = json.loads((ckpt / "config.json").read_text())["code2wav_config"]
    per_frame = math.prod(cfg["upsampling_ratios"]) * math.prod(cfg["upsample_rates"])
    return math.ceil(samples / per_frame)


def test_usage_counts_audio_tokens(client: openai.OpenAI, omni_ckpt: Path) -> None:
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, **SPOKEN)
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        got = answer(conn)
    usage = got["done"]["usage"]
    prompt, audio_in = prompt_counts(omni_ckpt, len(TURN) // 2)
    frames = codec_frames(omni_ckpt, len(got["audio"]) // 2)
    assert audio_in > 0 and frames > 0
    assert usage["input_tokens"] == prompt
    assert usage["input_token_details"] == {"audio_tokens": audio_in, "text_tokens": prompt - audio_in}
    assert usage["output_token_details"] == {"text_tokens": 12, "audio_tokens": frames}  # 12: max_output_tokens, EOS ignored
    assert usage["output_tokens"] == 12 + frames and usage["total_tokens"] == prompt + 12 + frames


def test_input_audio_transcription_equals_the_transcriptions_route(client: openai.OpenAI, omni_ckpt: Path) -> None:
    trsc = {"model": "qwen3omni", "seed": 7, "temperature": 1.0, "max_tokens": 8}  # sampled: the seed decides the text
    with client.realtime.connect(model="qwen3omni") as conn:
        session = configure(conn, audio={"input": {"turn_detection": None, "transcription": trsc}})
        assert session["audio"]["input"]["transcription"]["model"] == "qwen3omni"
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        events = until(conn, "conversation.item.input_audio_transcription.completed")
        item_id = events[0]["item_id"]
        conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = recv(conn)
    route = client.audio.transcriptions.create(model="qwen3omni", file=("turn.wav", base64.b64decode(wav_b64(TURN)), "audio/wav"),
                                               temperature=1.0, extra_body={"seed": 7, "max_tokens": 8})
    done = events[-1]
    deltas = "".join(e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta")
    assert route.text and done["transcript"] == deltas == route.text and done["item_id"] == item_id
    assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"]["content"][0]["transcript"] == route.text
    _, audio_in = prompt_counts(omni_ckpt, len(TURN) // 2)
    assert done["usage"]["output_tokens"] == route.usage.output_tokens and done["usage"]["input_tokens"] == route.usage.input_tokens
    assert done["usage"]["input_token_details"]["audio_tokens"] == audio_in


def test_no_transcription_unless_asked(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="qwen3omni") as conn:
        session = configure(conn, audio={"input": {"turn_detection": None}})
        assert session["audio"]["input"]["transcription"] is None
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        committed = recv(conn)
        conn.send({"type": "conversation.item.retrieve", "item_id": committed["item_id"]})
        events = until(conn, "conversation.item.retrieved")
        time.sleep(1)  # a transcription would have sent its events by now (a few tokens)
        conn.send({"type": "conversation.item.retrieve", "item_id": committed["item_id"]})
        later = recv(conn)
    assert [e["type"] for e in events] == ["conversation.item.created", "conversation.item.added", "conversation.item.done",
                                           "conversation.item.retrieved"]
    assert later["type"] == "conversation.item.retrieved" and later["item"]["content"][0]["transcript"] is None


def test_failed_transcription_is_an_event_and_the_session_stays(client: openai.OpenAI) -> None:
    """A transcription prompt longer than the model's context (4096 positions on the tiny
    checkpoint) fails in preprocessing, as it would over /v1/audio/transcriptions."""
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, audio={"input": {"turn_detection": None, "transcription": {"prompt": "word " * 5000}}})
        conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(TURN).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        events = until(conn, "conversation.item.input_audio_transcription.failed")
        conn.send({"type": "conversation.item.retrieve", "item_id": events[0]["item_id"]})
        retrieved = recv(conn)
    failed = events[-1]
    assert failed["item_id"] == events[0]["item_id"] and failed["error"]["code"] == "context_length_exceeded"
    assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"]["content"][0]["transcript"] is None


def test_items_added_and_done_where_openai_sends_them(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, output_modalities=["text"], seed=4, max_output_tokens=3, audio={"input": {"turn_detection": None}})
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Hi."}]}})
        created = [recv(conn) for _ in range(3)]
        conn.send({"type": "response.create"})
        events = until(conn, "response.done")
    assert [e["type"] for e in created] == ["conversation.item.created", "conversation.item.added", "conversation.item.done"]
    assert created[0]["item"] == created[1]["item"] == created[2]["item"] and created[2]["item"]["status"] == "completed"
    kinds = [e["type"] for e in events]
    added, done = events[kinds.index("conversation.item.added")], events[kinds.index("conversation.item.done")]
    final = events[-1]["response"]["output"][0]
    assert kinds.index("response.output_item.added") < kinds.index("conversation.item.added") < kinds.index("response.content_part.added")
    assert kinds.index("response.content_part.done") < kinds.index("conversation.item.done") < kinds.index("response.output_item.done")
    assert added["item"]["id"] == final["id"] and added["item"]["status"] == "in_progress"
    assert added["previous_item_id"] == done["previous_item_id"] == created[0]["item"]["id"]
    assert done["item"] == final and final["status"] == "incomplete"  # 3 tokens: max_output_tokens


def test_idle_timeout_option_reads_the_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner
    from mstar.cli.serve import serve

    assert "--realtime-idle-timeout" in CliRunner().invoke(serve, ["--help"]).output
    monkeypatch.setenv("MSTAR_REALTIME_IDLE_S", "42")
    assert serve.make_context("serve", ["toy"]).params["realtime_idle_timeout"] == 42.0
    assert serve.make_context("serve", ["toy", "--realtime-idle-timeout", "7"]).params["realtime_idle_timeout"] == 7.0
    monkeypatch.delenv("MSTAR_REALTIME_IDLE_S")
    assert serve.make_context("serve", ["toy"]).params["realtime_idle_timeout"] == 600.0


def metric(server: str, name: str) -> float:
    text = httpx.get(f"{server}/metrics", timeout=10).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.split("{")[0].split(" ")[0] == name)


def test_cancel_mid_answer_frees_every_block(client: openai.OpenAI, server: str) -> None:
    long = {"nodes": {"talker": {"max_tokens": 4000}}}  # minutes of work: only the cancel ends it
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, seed=1, ignore_eos=True, sampling=long, max_output_tokens=4000, audio={"input": {"turn_detection": None}})
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Talk for a long time."}]}})
        recv(conn)
        conn.send({"type": "response.create"})
        while recv(conn)["type"] != "response.output_audio.delta":
            pass
        deadline = time.monotonic() + 3  # the engines report their blocks every 0.1 s
        while not metric(server, "mstar_kv_blocks_used") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(server, "mstar_kv_blocks_used") > 0
        conn.send({"type": "response.cancel"})
        events = until(conn, "response.done")
        done = events[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert done["output"][0]["status"] == "incomplete"
        # Freed by the cancel itself: the session is still open.
        deadline = time.monotonic() + 5
        while metric(server, "mstar_kv_blocks_used") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(server, "mstar_kv_blocks_used") == 0 and metric(server, "mstar_running_requests") == 0
        after = answer(conn, max_output_tokens=4)  # and it answers again
        assert after["done"]["status"] == "incomplete" and after["done"]["status_details"]["reason"] == "max_output_tokens"


def test_server_vad_finds_the_turn_end_and_answers(client: openai.OpenAI) -> None:
    clip = pcm16(np.concatenate([np.zeros(RATE // 2, np.float32), vowel(1.5), np.zeros(RATE, np.float32)]))
    with client.realtime.connect(model="qwen3omni") as conn:
        session = configure(conn, seed=3, max_output_tokens=4, sampling=TALKER,
                            audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}})
        assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
        step = RATE // 10 * 2  # 100 ms
        for i in range(0, len(clip), step):
            conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(clip[i : i + step]).decode()})
        events = until(conn, "response.done")
    kinds = [e["type"] for e in events]
    started, stopped = events[kinds.index("input_audio_buffer.speech_started")], events[kinds.index("input_audio_buffer.speech_stopped")]
    committed = events[kinds.index("input_audio_buffer.committed")]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")
    assert 400 <= started["audio_start_ms"] <= 700, started
    assert 1300 <= stopped["audio_end_ms"] <= 2100, stopped
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert "response.created" in kinds and events[-1]["response"]["status"] == "incomplete"  # 4 tokens


def test_speech_during_an_answer_cancels_it(client: openai.OpenAI, server: str) -> None:
    """Barge-in: with server_vad, speech starting while a response plays cancels it."""
    clip = pcm16(np.concatenate([vowel(1.0), np.zeros(RATE, np.float32)]))
    long = {"nodes": {"talker": {"max_tokens": 4000}}}
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, seed=2, ignore_eos=True, sampling=long, max_output_tokens=4,
                  audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}})
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Talk for a long time."}]}})
        recv(conn)
        conn.send({"type": "response.create", "response": {"max_output_tokens": 4000}})
        while recv(conn)["type"] != "response.output_audio.delta":
            pass
        step = RATE // 10 * 2
        for i in range(0, len(clip), step):
            conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(clip[i : i + step]).decode()})
        events = until(conn, "response.done")
        cancelled = events[-1]["response"]
        assert "input_audio_buffer.speech_started" in [e["type"] for e in events]
        assert cancelled["status"] == "cancelled" and cancelled["status_details"]["reason"] == "turn_detected"
        # The turn that interrupted is committed and answered (4 tokens: the session's limit).
        events = until(conn, "response.done")
        kinds = [e["type"] for e in events]
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
        assert events[-1]["response"]["status"] == "incomplete" and events[-1]["response"]["usage"]["output_token_details"]["text_tokens"] == 4
        deadline = time.monotonic() + 5  # the long answer's blocks were freed by the barge-in
        while metric(server, "mstar_kv_blocks_used") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(server, "mstar_kv_blocks_used") == 0


def test_truncate_trims_what_the_model_said(client: openai.OpenAI) -> None:
    with client.realtime.connect(model="qwen3omni") as conn:
        configure(conn, **SPOKEN)
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Hello."}]}})
        recv(conn)
        said = answer(conn)
        item = said["done"]["output"][0]
        heard_ms = len(said["audio"]) // 2 * 1000 // RATE // 2
        conn.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0, "audio_end_ms": 10**6})
        assert recv(conn)["error"]["param"] == "audio_end_ms"  # past the audio's end
        conn.send({"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0, "audio_end_ms": heard_ms})
        event = recv(conn)
        assert event == {**event, "type": "conversation.item.truncated", "item_id": item["id"], "audio_end_ms": heard_ms}
        conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                               "content": [{"type": "input_text", "text": "Go on."}]}})
        recv(conn)
        after = answer(conn)
    kept = heard_ms * RATE // 1000 / (len(said["audio"]) // 2)
    heard = truncated(said["transcript"], kept)
    assert 0 < len(heard) < len(said["transcript"])
    chat = chat_stream(client, [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": heard},
                                {"role": "user", "content": "Go on."}], 11)
    assert after["transcript"] == chat["transcript"] and after["audio"] == chat["audio"]


def raw_ws(server: str, **kw: Any) -> ClientConnection:
    return connect(server.replace("http://", "ws://") + "/v1/realtime?model=qwen3omni", proxy=None, open_timeout=30, **kw)


def test_bad_events_are_error_events_and_the_session_stays(server: str) -> None:
    cases: list[tuple[Any, str, str | None]] = [
        ("not json", "invalid_json", None),
        ({"type": "bogus"}, "invalid_event", "type"),
        ({"type": "session.update", "session": {"output_modalities": ["video"]}}, "invalid_value", "session.output_modalities.0"),
        ({"type": "session.update", "session": {"audio": {"output": {"voice": "alloy"}}}}, "unknown_voice", "session.audio.output.voice"),
        ({"type": "session.update", "session": {"temperature": -1}}, None, "session.temperature"),
        ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", "input_audio_buffer"),
        ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_value", "audio"),
        ({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(2 * RATE * 21)).decode()}, "input_audio_buffer_full", "audio"),
        ({"type": "response.cancel"}, "response_cancel_not_active", None),
        ({"type": "response.create"}, "conversation_empty", None),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"model": "whisper-1"}}}}},
         "model_not_supported", "session.audio.input.transcription.model"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"temperature": 5}}}}},
         None, "session.audio.input.transcription.temperature"),
        ({"type": "conversation.item.retrieve", "item_id": "nope"}, "item_not_found", "item_id"),
        ({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 0}, "item_not_found", "item_id"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "output_audio"}]}},
         None, "item.content.0.type"),
        (b"\x00\x01", "invalid_message", None),
    ]
    with raw_ws(server, additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None) as ws:
        configure(ws, audio={"input": {"turn_detection": None}})
        for i, (message, code, param) in enumerate(cases):
            if isinstance(message, dict):
                message = json.dumps({**message, "event_id": f"evt_{i}"})
            ws.send(message)
            event = recv(ws)
            assert event["type"] == "error", (message, event)
            err = event["error"]
            assert err["type"] == "invalid_request_error" and (code is None or err["code"] == code) and err["param"] == param, (i, err)
            if isinstance(message, str) and message.startswith("{"):
                assert err["event_id"] == f"evt_{i}"
        ws.send(json.dumps({"type": "session.update", "session": {"instructions": "still here"}}))
        assert recv(ws)["session"]["instructions"] == "still here"


def test_api_key_header_or_subprotocol(server: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        raw_ws(server, additional_headers={"Authorization": "Bearer wrong"})
    assert refused.value.response.status_code == 403
    with raw_ws(server, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime" and recv(ws)["type"] == "session.created"


def test_idle_session_is_closed(server: str) -> None:
    with raw_ws(server, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert recv(ws)["type"] == "session.created"
        start = time.monotonic()
        event = recv(ws, timeout=IDLE_S + 30)
        assert event["type"] == "error" and event["error"]["code"] == "session_idle_timeout"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert IDLE_S - 1 <= time.monotonic() - start <= IDLE_S + 30


def test_every_event_matched_the_openai_types() -> None:
    if not SEEN:
        pytest.skip("collects the events of this module's other tests")
    print("server events checked against openai.types.realtime:", ", ".join(sorted(SEEN)))
    assert {"session.created", "session.updated", "input_audio_buffer.committed", "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped", "conversation.item.created", "response.created", "response.output_audio.delta",
            "response.output_audio_transcript.delta", "response.output_text.delta", "response.output_audio.done",
            "response.output_audio_transcript.done", "response.output_text.done", "response.done", "error",
            "conversation.item.added", "conversation.item.done", "conversation.item.retrieved",
            "conversation.item.input_audio_transcription.delta", "conversation.item.input_audio_transcription.completed",
            "conversation.item.input_audio_transcription.failed"} <= SEEN

