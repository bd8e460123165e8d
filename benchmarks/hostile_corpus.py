"""A hostile request corpus against a live ``mstar serve``: counts the answers that are 5xx.

Every case is valid or invalid input a client may send; none may be a 5xx (that would be a
fault of the server), and a connection must survive every answer (the next request on the
same keep-alive connection is read). The corpus is deterministic: for each route's base body
(chat, completions, speech, generate, voices) every field, nested field and an unknown one
takes each hostile value in turn: lone surrogates (alone, inside text, as a key), nesting
900 and 100,000 deep, wrong types, booleans where token ids go, numbers that overflow to
infinity or beyond 64 bits, huge strings and empty containers; and a few raw bodies (raw
surrogate bytes, invalid UTF-8, ``NaN``). The WebSocket route (``/v1/audio/speech/stream``)
gets the same values in every field of its ``session`` and ``text`` messages, on one socket:
each must be answered by nothing or an ``error`` event that is not a server error, and the
socket must stay open.

    python benchmarks/hostile_corpus.py --url http://127.0.0.1:8000 [--model toy] [--api-key KEY]
    python benchmarks/hostile_corpus.py --count      # just the number of cases

It prints the count per status, each 5xx (and each reset connection) with its case, and exits
1 when any answer was a 5xx or a connection was reset.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

SURROGATE = "\ud800"


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: bytes
    content_type: str = "application/json"


def nested(depth: int, kind: str = "list") -> str:
    """JSON text of ``depth`` nested lists (or objects)."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# Hostile values as JSON text (some are not expressible as Python values: nesting too deep
# for ``json.dumps``, numbers beyond a float).
HOSTILE: dict[str, str] = {
    "surrogate": json.dumps(SURROGATE),
    "surrogate_low": json.dumps("\udfff"),
    "surrogate_in_text": json.dumps("ab\udc00cd"),
    "surrogate_list": json.dumps([SURROGATE]),
    "surrogate_key": '{"\\ud800": 1}',
    "surrogate_deep": json.dumps({"a": [{"b": SURROGATE}]}),
    "nest_900_list": nested(900),
    "nest_900_object": nested(900, "object"),
    "nest_100k": nested(100_000),
    "true": "true",
    "null": "null",
    "bools": "[true, false]",
    "nested_bools": "[[true]]",
    "floats": "[1.5, 2.5]",
    "huge_float": "1e999",
    "neg_huge_float": "-1e999",
    "max_float": "1.7976931348623157e308",
    "int_65_bits": str(1 << 65),
    "neg_int_70_bits": str(-(1 << 70)),
    "zero": "0",
    "negative": "-1",
    "empty_string": '""',
    "empty_list": "[]",
    "empty_object": "{}",
    "long_string": json.dumps("x" * 100_000),
    "control_chars": json.dumps("\x00\x01\x1b[31m"),
    "number_string": '"12"',
}

BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0.5, "stop": ["x"], "seed": 1, "n": 1, "stream": False,
        "stream_options": {"include_usage": True}, "logprobs": False, "top_logprobs": 1,
        "modalities": ["text"], "audio": {"voice": "alloy", "format": "wav"}, "user": "u",
        "sampling": {"top_k": 5, "aux": {}}, "stop_token_ids": [1], "logit_bias": {"1": 0},
    },
    "/v1/completions": {
        "model": "MODEL", "prompt": "hi", "max_tokens": 4, "stop": "x", "echo": False, "logprobs": 0,
        "n": 1, "best_of": 1, "suffix": None, "seed": 1, "stream": False, "top_p": 0.9,
    },
    "/v1/audio/speech": {
        "model": "MODEL", "input": "hi", "voice": "alloy", "response_format": "wav", "speed": 1.0,
        "stream_format": "sse", "max_tokens": 4, "instructions": "calm", "stop": ["x"], "seed": 1,
    },
    "/v1/generate": {
        "model": "MODEL", "inputs": {"prompt_ids": [1, 2, 3]}, "sampling": {"max_tokens": 3},
        "kwargs": {"k": "v"}, "signals": ["token"], "stream": False, "output_format": "base64",
    },
    "/v1/audio/voices": {"name": "v1", "transcript": "hello", "audio": "AAAA"},
}


WS_PATH = "/v1/audio/speech/stream"
WS_BASES: dict[str, dict[str, Any]] = {
    "session": {"type": "session", "model": "MODEL", "voice": "alloy", "temperature": 0.5, "max_tokens": 4,
                "seed": 1, "max_segment_chars": 300, "sampling": {"top_k": 5}},
    "text": {"type": "text", "text": "hi"},
}
# Always answered with an error event (an unknown type): marks where a case's answers end.
WS_PROBE = '{"type": "zz_probe"}'


def _paths(value: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every field's path in a body (objects and list items, the containers themselves too)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*prefix, i)
            yield from _paths(item, (*prefix, i))


_MARK = "\x00HOSTILE\x00"


def _with(body: dict[str, Any], path: tuple[str | int, ...], raw: str) -> bytes:
    """``body`` as JSON with the field at ``path`` replaced by the JSON text ``raw``."""
    copy = json.loads(json.dumps(body))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = _MARK
    return json.dumps(copy).replace(json.dumps(_MARK), raw).encode()


def cases(model: str = "toy") -> list[Case]:
    out: list[Case] = []
    for route, template in BASES.items():
        base = json.loads(json.dumps(template).replace('"MODEL"', json.dumps(model)))
        targets = [*_paths(base), ("zz_unknown",)]
        if "kwargs" in base:
            targets.append(("kwargs", "zz_unknown"))
        if "messages" in base:
            targets.append(("messages", 0, "zz_unknown"))
        for path in targets:
            for name, raw in HOSTILE.items():
                where = ".".join(map(str, path))
                out.append(Case(f"{route} {where}={name}", route, _with(base, path, raw)))
        for name, raw in (("surrogate_key_top", '"\\ud800": 1'), ("deep_top", f'"zz": {nested(900)}')):
            text = json.dumps(base)
            out.append(Case(f"{route} {name}", route, (text[:-1] + ", " + raw + "}").encode()))
    raw_bodies = {
        "raw_surrogate_bytes": b'{"model": "M", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        "invalid_utf8": b'{"model": "M", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "nan": b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        "not_an_object": b"[1, 2, 3]",
        "truncated": b'{"model": "M", "messages": [',
        "empty": b"",
    }
    for route in BASES:
        for name, raw in raw_bodies.items():
            out.append(Case(f"{route} raw {name}", route, raw.replace(b'"M"', json.dumps(model).encode())))
    # The multipart twin of /v1/generate: its JSON rides in a form field.
    for name, raw in HOSTILE.items():
        body = json.dumps({"model": model, "kwargs": {"k": _MARK}, "sampling": {"max_tokens": 2}}).replace(json.dumps(_MARK), raw)
        form = (b"--B\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n" + body.encode("utf-8", "surrogatepass")
                + b"\r\n--B\r\nContent-Disposition: form-data; name=\"prompt_ids\"; filename=\"p\"\r\n\r\nabc\r\n--B--\r\n")
        out.append(Case(f"/v1/generate/upload kwargs.k={name}", "/v1/generate/upload", form, "multipart/form-data; boundary=B"))
    return out


def ws_cases(model: str = "toy") -> list[Case]:
    """Hostile messages of the WebSocket speech route (``body``: one text frame)."""
    out: list[Case] = []
    for kind, template in WS_BASES.items():
        base = json.loads(json.dumps(template).replace('"MODEL"', json.dumps(model)))
        for path in [p for p in _paths(base) if p != ("type",)] + [("zz_unknown",)]:
            for name, raw in HOSTILE.items():
                out.append(Case(f"ws {kind} {'.'.join(map(str, path))}={name}", WS_PATH, _with(base, path, raw)))
    for name, raw in (("raw_surrogate_bytes", b'{"type": "text", "text": "\xed\xa0\x80"}'), ("not_json", b"{oops"),
                      ("array", b"[1]"), ("deep", nested(900).encode())):
        out.append(Case(f"ws raw {name}", WS_PATH, raw))
    return out


def run_ws(url: str, corpus: list[Case], api_key: str | None, timeout: float) -> tuple[Counter[str], list[str], list[str]]:
    """Send each case on one socket, then the probe; every event up to the probe's error is
    the case's answer. Returns answers by kind ("error", "none", ...), the server errors, and
    the cases after which the socket closed (it is reopened)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://", 1) + WS_PATH
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    answers: Counter[str] = Counter()
    faults: list[str] = []
    closed: list[str] = []
    ws = connect(ws_url, additional_headers=headers, proxy=None, open_timeout=timeout)
    try:
        for case in corpus:
            try:
                ws.send(case.body.decode("utf-8", "surrogatepass") if b"\xed" not in case.body else case.body)
                ws.send(WS_PROBE)
                kind = "none"
                while True:
                    frame = ws.recv(timeout=timeout)
                    if isinstance(frame, bytes):
                        continue  # audio of a sentence the case started
                    event = json.loads(frame)
                    error = event.get("error") or {}
                    if event.get("type") == "error" and error.get("param") == "type" and "zz_probe" in error.get("message", ""):
                        break
                    if event.get("type") == "error":
                        kind = "error"
                        if error.get("type") == "server_error" or error.get("code") == "internal_error":
                            faults.append(f"{case.name}: {frame[:200]}")
                    elif kind == "none":
                        kind = str(event.get("type"))
                answers[kind] += 1
            except (ConnectionClosed, TimeoutError) as exc:
                closed.append(f"{case.name}: {type(exc).__name__} {exc}")
                ws.close()
                ws = connect(ws_url, additional_headers=headers, proxy=None, open_timeout=timeout)
    finally:
        ws.close()
    return answers, faults, closed


def run(url: str, corpus: list[Case], api_key: str | None, timeout: float) -> tuple[Counter[int], list[str], list[str]]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    statuses: Counter[int] = Counter()
    faults: list[str] = []
    resets: list[str] = []
    client = httpx.Client(base_url=url, headers=headers, timeout=timeout)
    try:
        for case in corpus:
            try:
                r = client.post(case.path, content=case.body, headers={"content-type": case.content_type})
            except httpx.TransportError as exc:
                resets.append(f"{case.name}: {type(exc).__name__} {exc}")
                client.close()
                client = httpx.Client(base_url=url, headers=headers, timeout=timeout)
                continue
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                faults.append(f"{r.status_code} {case.name}: {r.text[:200]}")
    finally:
        client.close()
    return statuses, faults, resets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="toy")
    ap.add_argument("--api-key")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--count", action="store_true", help="print the number of cases and exit")
    args = ap.parse_args()
    corpus, ws_corpus = cases(args.model), ws_cases(args.model)
    if args.count:
        print(len(corpus) + len(ws_corpus))
        return 0
    statuses, faults, resets = run(args.url.rstrip("/"), corpus, args.api_key, args.timeout)
    print(f"{len(corpus)} HTTP cases: " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
    print(f"5xx: {len(faults)}; connections reset: {len(resets)}")
    answers, ws_faults, closed = run_ws(args.url.rstrip("/"), ws_corpus, args.api_key, args.timeout)
    print(f"{len(ws_corpus)} WebSocket cases: " + ", ".join(f"{k}: {n}" for k, n in sorted(answers.items())))
    print(f"server errors: {len(ws_faults)}; sockets closed: {len(closed)}")
    for line in faults + resets + ws_faults + closed:
        print("  " + line)
    return 1 if faults or resets or ws_faults or closed else 0


if __name__ == "__main__":
    sys.exit(main())
