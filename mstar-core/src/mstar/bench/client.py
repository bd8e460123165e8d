"""Sending one benchmark request over HTTP and timing its response chunks.

Chat requests stream Server-Sent Events (``stream: true`` with usage in the last chunk);
speech requests stream raw PCM (``stream_format: "audio"``) or SSE audio deltas
(``"sse"``). A chunk's time is taken when httpx hands it over, before it is parsed.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec

from mstar.bench.records import BenchRequest, RequestRecord

_decode = msgspec.json.Decoder()
PCM16_BYTES = 2


async def send(client: httpx.AsyncClient, request: BenchRequest, stream: bool = True, speech_format: str = "audio") -> RequestRecord:
    """Send ``request`` and return what it measured; an HTTP or protocol error is recorded
    in the record (``ok`` False), never raised."""
    record = RequestRecord(request.workload)
    start = time.perf_counter()
    try:
        if request.workload == "chat":
            await (_chat_stream(client, request.body, record, start) if stream else _chat_whole(client, request.body, record))
        else:
            await _speech(client, request.body, record, start, speech_format)
    except (httpx.HTTPError, ValueError, KeyError, msgspec.DecodeError) as exc:
        record.ok = False
        record.error = record.error or f"{type(exc).__name__}: {exc}"
    record.latency = time.perf_counter() - start
    return record


async def _failed(response: httpx.Response, record: RequestRecord) -> bool:
    record.status = response.status_code
    if response.status_code == 200:
        return False
    body = (await response.aread()).decode(errors="replace")
    record.error = f"HTTP {response.status_code}: {body[:500]}"
    return True


async def _chat_whole(client: httpx.AsyncClient, body: dict[str, Any], record: RequestRecord) -> None:
    response = await client.post("/v1/chat/completions", json={**body, "stream": False})
    if await _failed(response, record):
        return
    usage = response.json()["usage"]
    record.prompt_tokens, record.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
    record.ok = True


async def _chat_stream(client: httpx.AsyncClient, body: dict[str, Any], record: RequestRecord, start: float) -> None:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    done = False
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if await _failed(response, record):
            return
        async for line in response.aiter_lines():
            now = time.perf_counter() - start
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            event = _decode.decode(data)
            if "error" in event:
                record.error = f"stream error: {event['error'].get('message')}"
                continue
            if event.get("usage"):
                record.prompt_tokens = event["usage"]["prompt_tokens"]
                record.output_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("audio"):
                    record.chunk_times.append(now)
    if not done and record.error is None:
        record.error = "the stream ended without data: [DONE]"
    record.ok = record.error is None and record.output_tokens is not None


async def _speech(client: httpx.AsyncClient, body: dict[str, Any], record: RequestRecord, start: float, fmt: str) -> None:
    if fmt not in ("audio", "sse"):
        raise ValueError(f"speech stream format {fmt!r}: expected 'audio' or 'sse'")
    body = {**body, "response_format": "pcm", "stream_format": fmt}
    audio_bytes = 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if await _failed(response, record):
            return
        rate = int(response.headers["x-sample-rate"])
        if fmt == "audio":
            async for chunk in response.aiter_bytes():
                if chunk:
                    record.chunk_times.append(time.perf_counter() - start)
                    audio_bytes += len(chunk)
            done = True  # a failed raw stream ends without its last chunk: httpx raises
        else:
            done = False
            async for line in response.aiter_lines():
                now = time.perf_counter() - start
                if not line.startswith("data:"):
                    continue
                event = _decode.decode(line[5:].strip())
                kind = event.get("type")
                if kind == "speech.audio.delta":
                    record.chunk_times.append(now)
                    audio_bytes += _b64_len(event["audio"])
                elif kind == "error":
                    record.error = f"stream error: {event['error'].get('message')}"
                elif kind == "speech.audio.done":
                    done = True
    if not done and record.error is None:
        record.error = "the stream ended without speech.audio.done"
    record.audio_seconds = audio_bytes / PCM16_BYTES / rate
    record.ok = record.error is None


def _b64_len(text: str) -> int:
    """Decoded size of base64 ``text`` without decoding it."""
    return len(text) * 3 // 4 - text[-2:].count("=")
