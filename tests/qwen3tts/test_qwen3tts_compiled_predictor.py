"""The code predictor's steps through ``torch.compile`` (``EngineConfig.compile_regions``)
compute what the eager steps do, for one row and several, over a whole frame, without
falling back to eager; the engine-level check (same codes and audio as without) is in
``test_qwen3tts_engine.py``."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from mstar_qwen3tts.code_predictor import CodePredictor
from qwen3tts_helpers import small_predictor
from torch._dynamo.utils import counters


def _predictor() -> CodePredictor:
    return small_predictor(talker_hidden=64)


class _Recorder:
    """Greedy draws that keep every step's logits."""

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []

    def sample_aux(self, label: str, logits: torch.Tensor) -> SimpleNamespace:
        self.logits.append(logits.clone())
        return SimpleNamespace(tokens=logits.argmax(-1))


def _frame(model: CodePredictor, rows: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    hidden, first = torch.randn(rows, 64, generator=gen), torch.randn(rows, 64, generator=gen)
    rec = _Recorder()
    with torch.inference_mode():
        codes, _ = model(hidden, first, rec)
    return codes, rec.logits


def test_compiled_steps_compute_what_eager_steps_do() -> None:
    eager, compiled = _predictor(), _predictor()
    compiled.compile_steps()
    before = counters["stats"]["unique_graphs"]
    for rows, seed in [(1, 1), (3, 2), (5, 3), (1, 4)]:
        want_codes, want_logits = _frame(eager, rows, seed)
        got_codes, got_logits = _frame(compiled, rows, seed)
        assert torch.equal(got_codes, want_codes), rows
        for got, want in zip(got_logits, want_logits, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The steps ran as compiled graphs (first step and later ones, one row and several).
    assert counters["stats"]["unique_graphs"] - before >= 2
    assert not counters["graph_break"], dict(counters["graph_break"])
