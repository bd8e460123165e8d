"""Core's stop rules on the toy, whose plugin has no stop code of its own."""

from __future__ import annotations

import pytest
import torch
from mstar_toy.config import encode_text

PROMPT = torch.tensor(encode_text("stop rules", 256))
AUX = {"residual": {"temperature": 0}}


def _run(engine, **main):
    result = engine.run_batch([{"inputs": {"prompt_ids": PROMPT}, "sampling": {"main": {"temperature": 0, **main}, "aux": AUX}}])[0]
    assert result.error is None, result.error
    return result.cat("token").tolist(), result.finish_reason


@pytest.fixture(scope="module")
def engine(toy_ckpt):
    from mstar import Engine

    e = Engine.from_model("toy", weights=toy_ckpt)
    yield e
    e.close()


@pytest.fixture(scope="module")
def free_run(engine):
    tokens, reason = _run(engine, max_tokens=12, ignore_eos=True)
    assert len(tokens) == 12 and reason == "length"
    return tokens


@pytest.mark.parametrize("n", [1, 2, 5])
def test_max_tokens(engine, free_run, n):
    assert _run(engine, max_tokens=n, ignore_eos=True) == (free_run[:n], "length")


def test_a_stop_id_ends_the_request_and_is_withheld(engine, free_run):
    stop = free_run[4]
    first = free_run.index(stop)
    tokens, reason = _run(engine, max_tokens=12, ignore_eos=True, stop_token_ids=[stop])
    assert (tokens, reason) == (free_run[:first], "stop")


def test_min_tokens_suppresses_stop_ids(engine, free_run):
    stop = free_run[0]
    tokens, reason = _run(engine, max_tokens=6, ignore_eos=True, stop_token_ids=[stop], min_tokens=3)
    assert len(tokens) >= 3 and stop not in tokens[:3]
    assert reason == ("stop" if len(tokens) < 6 else "length")


def test_model_end_id_stops_unless_ignore_eos(free_run, toy_ckpt, tmp_path):
    import json
    import shutil

    from mstar import Engine

    # The same weights, with the checkpoint's end id set to a token the model draws.
    shutil.copytree(toy_ckpt, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["eos_token_id"] = free_run[3]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    first = free_run.index(free_run[3])
    with Engine.from_model("toy", weights=tmp_path / "ckpt") as engine:
        assert _run(engine, max_tokens=12) == (free_run[:first], "stop")
        assert _run(engine, max_tokens=12, ignore_eos=True) == (free_run, "length")
