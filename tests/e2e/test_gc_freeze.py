"""``mstar serve`` keeps its start-up objects out of Python's cyclic garbage collector, in
the engine process (after the build) and in the API process (after the warm-up): a full
collection would otherwise walk them all (``benchmarks/gc_pauses.py``: 185 ms over 374,000
objects for the tiny text LM), a pause in every running stream."""

from __future__ import annotations

import re

import openai


def test_engine_and_api_processes_freeze_what_they_built(start_server):
    server = start_server([])
    log = server.log_tail(20000)
    frozen = {m.group(1): int(m.group(2)) for m in re.finditer(r"(engine \S+|API process, model \S+): (\d+) start-up objects", log)}
    assert any(k.startswith("engine") for k in frozen) and any(k.startswith("API process") for k in frozen), log[-2000:]
    assert all(n > 10_000 for n in frozen.values()), frozen  # torch, the plugin and the model: far more than this
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    # The warm-up request ran before the server said it was ready: the engine froze again
    # after it, with more objects than at its build (what the first forwards made).
    log = server.log_tail(20000)
    again = re.search(r"engine (\S+) after its first request: (\d+) start-up objects", log)
    assert again, log[-2000:]
    assert int(again.group(2)) > frozen[f"engine {again.group(1)}"]
