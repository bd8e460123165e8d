"""``mstar serve --dtype``: the engine builds its nodes in the asked dtype (the toy's LM in
bfloat16, its decoder kept float32), and the server answers; a bad value is refused."""

from __future__ import annotations

import subprocess
import sys

import openai


def test_serves_the_toy_in_bfloat16(start_server):
    server = start_server(["--dtype", "bfloat16"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, seed=3)
    assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens > 0
    log = server.log_tail(400)
    assert "'lm': ['bfloat16']" in log and "'decoder': ['float32']" in log, log


def test_an_unknown_dtype_is_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "mstar.cli", "serve", "toy", "--random-weights", "--dtype", "bf32"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "'bf32' is not one of" in out.stderr, out.stderr
