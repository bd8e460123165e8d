"""Stop strings on detokenized text: the released text equals ``decode(ids)`` cut before the
stop string that completes first (reading left to right), whichever tokens it spans and
however the ids arrive, and nothing past it is ever released."""

from __future__ import annotations

import random

import pytest
import torch
from mstar.api.text_adapter import DetokenizingTextDecoder
from mstar.server.text_output import TextAssembler, finish_reason, stop_strings
from tokenizers_for_tests import ALL

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["byte_level_bpe", "sentencepiece_bpe"])
def test_released_text_is_decode_cut_at_the_first_stop(name: str) -> None:
    tok = ALL[name]()
    rng = random.Random(7)
    corpus = "Hello wörld, 你好 🙂! The quick brown fox jumps over the lazy dog again and again."
    for _ in range(200):
        start = rng.randrange(len(corpus) - 20)
        ids = tok.encode(corpus[start:start + rng.randint(5, 40)], add_special_tokens=False)
        full = tok.decode(ids, skip_special_tokens=True)
        stops = []
        for _ in range(rng.randint(1, 3)):  # substrings of the text (most span tokens), or absent ones
            a = rng.randrange(len(full))
            stops.append(full[a:a + rng.randint(1, 6)] if rng.random() < 0.8 else "zzz")
        hits = [(full.find(s) + len(s), full.find(s)) for s in stops if s in full]
        want = full[: min(hits)[1]] if hits else full
        text = TextAssembler(DetokenizingTextDecoder(tok), stops)
        released = ""
        i = 0
        while i < len(ids) and not text.stopped:
            step = rng.randint(1, 3)
            released += text.feed(torch.tensor(ids[i:i + step]))
            assert want.startswith(released), (stops, full, released)
            i += step
        released += text.finish()
        assert (released, text.stopped) == (want, bool(hits)), (stops, full)


def test_request_fields_and_finish_reasons() -> None:
    assert stop_strings(None) == () and stop_strings("x") == ("x",) and stop_strings(["a", "b"]) == ("a", "b")
    assert finish_reason("length") == "length"
    assert [finish_reason(r) for r in ("stop", None)] == ["stop", "stop"]
