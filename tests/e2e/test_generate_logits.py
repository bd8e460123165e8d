"""``/v1/generate`` with kwarg ``return_logits``: the ``logits`` output is ``[steps, vocab]``,
one row per sampled token (row i's argmax is token i at temperature 0), whole, as
safetensors and through ``mstar.client``; streamed, each line is one step's ``[vocab]``."""

from __future__ import annotations

import json

import httpx
import torch
from mstar.api.tensors import tensor_from_json
from mstar.client import Client

STEPS = 6
BODY = {"model": "toy", "inputs": {"prompt_ids": [256, *b"logits"]}, "kwargs": {"return_logits": True},
        "sampling": {"temperature": 0, "max_tokens": STEPS, "ignore_eos": True}, "signals": ["token", "logits"]}


def test_logits_are_steps_by_vocab(start_server) -> None:
    server = start_server()
    out = httpx.post(f"{server.url}/v1/generate", json=BODY, timeout=60).json()["outputs"]
    tokens = tensor_from_json(out["token"], "token").reshape(-1)
    logits = tensor_from_json(out["logits"], "logits")
    assert logits.dim() == 2 and logits.shape[0] == STEPS == len(tokens) and logits.shape[1] > 256
    assert torch.equal(logits.argmax(-1), tokens)
    from safetensors.torch import load

    st = load(httpx.post(f"{server.url}/v1/generate", json={**BODY, "output_format": "safetensors"}, timeout=60).content)
    assert torch.equal(st["logits"], logits)
    with Client(server.url) as c:
        assert torch.equal(c.generate(BODY["inputs"], "toy", sampling=BODY["sampling"], kwargs=BODY["kwargs"]).outputs["logits"], logits)
    with httpx.stream("POST", f"{server.url}/v1/generate", json={**BODY, "stream": True}, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    steps = [tensor_from_json(x["tensor"], "logits") for x in lines if x.get("signal") == "logits"]
    assert torch.equal(torch.stack(steps), logits)
