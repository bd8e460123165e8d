"""``NodeSamplers.prompt_signal`` may name an optional request input (e.g. an encoder-decoder's
decoder prompt, defaulted by the model): a request without it runs, its penalties seeing no
prompt ids; a request with it has the penalties see those ids."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar_toy.checkpoint import write_checkpoint

OPTIONAL = "decoder_prompt_ids"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    e = Engine.from_model("toy", weights=write_checkpoint(tmp_path_factory.mktemp("toy")))
    node = e.core.nodes["lm"]
    node.sampler_decl = dataclasses.replace(node.sampler_decl, prompt_signal=OPTIONAL)
    yield e
    e.close()


def _tokens(engine: Engine, extra: dict[str, torch.Tensor], penalty: float = 1.0) -> list[int]:
    sampling = {"lm": {"main": {"temperature": 0, "max_tokens": 4, "ignore_eos": True, "repetition_penalty": penalty}}}
    [out] = engine.run_batch([{"inputs": {"prompt_ids": torch.tensor([256, *b"hello"]), **extra}, "sampling": sampling}])
    assert out.finish_reason == "length", out
    return out.cat("token").tolist()


def test_a_request_without_the_optional_prompt_runs(engine: Engine, tmp_path: Path) -> None:
    greedy = _tokens(engine, {})
    assert len(greedy) == 4
    assert _tokens(engine, {}, penalty=50.0) == greedy  # no prompt ids: nothing to penalise at step 0 (4 tokens, no repeats here)
    # the optional prompt holding the greedy first token: a repetition penalty (over prompt and output ids) now steers away from it
    penalised = _tokens(engine, {OPTIONAL: torch.tensor([greedy[0]])}, penalty=50.0)
    assert penalised[0] != greedy[0]
