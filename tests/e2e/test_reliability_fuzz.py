"""schemathesis against a live toy server, from its own ``/openapi.json``: schema-valid and
schema-violating requests on every operation. No answer may be a 5xx or take over 30 s.
Bounded and reproducible: a fixed number of cases per operation, derandomized (a fixed
seed); about two minutes on two CPU cores. Select with ``-m fuzz``, skip with ``-m 'not fuzz'``.

The hostile corpus (``benchmarks/hostile_corpus.py``, about 2,100 cases, half a minute) adds
what the schema cannot generate: lone surrogates in every string field and key, nesting 900
and 100,000 deep, numbers beyond a float, booleans as token ids; no answer may be a 5xx, and
no connection may be reset."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz]

CASES = 15  # per operation and generation mode
SLOW_S = 30.0
MAX_TOKENS = 16  # generated lengths are capped: the fuzz tests validation, not generation


def _bounded(body: object) -> None:
    """Reach past the model check (a random ``model`` is a plain 404) and keep generated
    requests short: any valid length field is clamped to a few tokens."""
    if isinstance(body, dict):
        if isinstance(body.get("model"), str):
            body["model"] = "toy"
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > MAX_TOKENS:
                body[key] = MAX_TOKENS
        if isinstance(body.get("input"), str):
            body["input"] = body["input"][:64]


# The schema leaves these open while the server checks their ranges, so a generated value
# is mostly a 400: each schema-valid body is sent once more without them, to reach the handlers.
STREAMED_ROUTES = {"/v1/chat/completions", "/v1/completions"}  # their stream=True handler is a separate path
RANGE_CHECKED = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                 "speed", "logit_bias", "n", "best_of", "sampling", "min_tokens", "top_logprobs", "logprobs"}


def _stream_fault(response) -> bool:
    """An event stream that carried a server-side error event, or ended without ``[DONE]``
    (unless schemathesis stopped reading it early)."""
    kind = response.headers.get("content-type") or ""
    kind = kind[0] if isinstance(kind, list) and kind else kind  # schemathesis keeps header lists
    if not str(kind).startswith("text/event-stream"):
        return False
    ended = "data: [DONE]" in response.text or response.stream_cut_short
    return "server_error" in response.text or not ended


def test_fuzz_openapi_no_5xx_no_slow_answer(start_server):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    server = start_server(["--preprocess-workers", "0", "--request-timeout", "25"])
    schema = schemathesis.openapi.from_dict(httpx.get(f"{server.url}/openapi.json", timeout=10).json())
    problems: list[str] = []
    calls = 0
    statuses = [0, 0]  # [4xx answers, 2xx/3xx answers]
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            positive = mode == schemathesis.GenerationMode.POSITIVE

            @settings(max_examples=CASES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                nonlocal calls
                _bounded(case.body)
                bodies = [case.body]
                if positive and isinstance(case.body, dict):  # noqa: B023 (run() is called in this iteration)
                    bodies.append({k: v for k, v in case.body.items() if k not in RANGE_CHECKED})
                    if case.path in STREAMED_ROUTES:
                        # A stream answers 200 before it runs: its faults show only as error events.
                        # Few tokens: schemathesis stops reading a stream after 20 events.
                        short = {k: v for k, v in bodies[-1].items() if k != "max_completion_tokens"}
                        bodies.append({**short, "stream": True, "max_tokens": 8})
                for body in bodies:
                    case.body = body
                    t0 = time.monotonic()
                    response = case.call(base_url=server.url, timeout=SLOW_S + 5)
                    elapsed = time.monotonic() - t0
                    calls += 1
                    statuses[response.status_code < 400] += 1
                    if response.status_code >= 500 or elapsed > SLOW_S or _stream_fault(response):
                        problems.append(f"{case.method} {case.path} -> {response.status_code} in {elapsed:.1f}s: "
                                        f"body={str(body)[:300]!r} answer={response.text[:300]!r}")

            with contextlib.suppress(Unsatisfiable):  # nothing to violate (an operation without inputs)
                run()
    assert not problems, "\n".join(problems[:10]) + f"\n({len(problems)} of {calls} calls)\n" + server.log_tail(40)
    assert calls >= 100 and statuses[1] >= 20, statuses  # enough cases reached a handler
    assert server.health().status_code == 200


CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "hostile_corpus.py"


def test_hostile_corpus_no_5xx_no_reset(start_server):
    spec = importlib.util.spec_from_file_location("hostile_corpus", CORPUS)
    corpus = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = corpus  # its dataclass looks itself up there
    spec.loader.exec_module(corpus)
    server = start_server(["--preprocess-workers", "0", "--request-timeout", "25"])
    cases = corpus.cases("toy")
    assert len(cases) >= 1000
    statuses, faults, resets = corpus.run(server.url, cases, None, SLOW_S)
    assert not faults and not resets, "\n".join((faults + resets)[:10]) + f"\n({len(faults)} 5xx, {len(resets)} resets)\n" + server.log_tail(40)
    assert statuses[400] > len(cases) // 2 and statuses[200] > 0, statuses
    # The WebSocket speech route: every hostile message answered by nothing or a client
    # error event, the socket open throughout (a planted fault on long texts closes it).
    ws_cases = corpus.ws_cases("toy")
    answers, ws_faults, closed = corpus.run_ws(server.url, ws_cases, None, SLOW_S)
    assert not ws_faults and not closed, "\n".join((ws_faults + closed)[:10]) + "\n" + server.log_tail(40)
    assert answers["error"] > len(ws_cases) // 2, answers
    assert server.health().status_code == 200
