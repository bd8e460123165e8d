"""The talker's frame region (first code, the code predictor's depth loop, the summed code
embeddings) compiled whole (``EngineConfig.compile_regions``, ``Talker.compile_regions``)
computes what the eager region does, for one row and several, without a graph break; the
engine-level check (same codes and audio as without) is in ``test_qwen3tts_engine.py``."""

from __future__ import annotations

import torch
from mstar_qwen3tts.talker import Talker
from torch._dynamo.utils import counters


class _Recorder:
    """Greedy draws that keep every draw's logits (main and aux)."""

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []

    def sample(self, logits: torch.Tensor):
        return self.sample_aux("main", logits)

    def sample_aux(self, label: str, logits: torch.Tensor):
        self.logits.append(logits.clone())
        return _Tokens(logits.argmax(-1))


class _Tokens:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens


def _talker(cfg) -> Talker:
    torch.manual_seed(0)
    return Talker(cfg).eval()


def _frame(talker: Talker, rows: int, seed: int) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    width, vocab = talker.cfg.hidden_size, talker.cfg.vocab_size
    inputs = {"hidden": torch.randn(rows, width, generator=gen), "logits": torch.randn(rows, vocab, generator=gen)}
    rec = _Recorder()
    with torch.inference_mode():
        out = talker.sample_frame(inputs, rec)
    return out, rec.logits


def test_the_compiled_frame_computes_what_the_eager_frame_does(tiny_cfg) -> None:
    eager, compiled = _talker(tiny_cfg), _talker(tiny_cfg)
    assert compiled.compile_regions() == 2
    before = counters["stats"]["unique_graphs"]
    for rows, seed in [(1, 1), (3, 2), (5, 3), (1, 4)]:
        want, want_logits = _frame(eager, rows, seed)
        got, got_logits = _frame(compiled, rows, seed)
        assert torch.equal(got["codes"], want["codes"]), rows
        torch.testing.assert_close(got["frame_embed"], want["frame_embed"], rtol=1e-5, atol=1e-5)
        assert len(got_logits) == len(want_logits) == tiny_cfg.talker.num_code_groups
        for g, w in zip(got_logits, want_logits, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # The frame ran as compiled graphs (one row, then several), whole.
    assert counters["stats"]["unique_graphs"] - before >= 2
    assert not counters["graph_break"], dict(counters["graph_break"])
