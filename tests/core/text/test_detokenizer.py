"""Property: the incremental detokenizer's deltas concatenate to ``tokenizer.decode`` of
the whole sequence, for random token streams fed in random chunks, and never show text
that a later token changes."""

from __future__ import annotations

import random

import pytest
from mstar.text import IncrementalDetokenizer
from tokenizers_for_tests import ADDED, ALL

pytest.importorskip("transformers")

STREAMS = 150


@pytest.fixture(scope="module", params=sorted(ALL))
def tokenizer(request):
    return ALL[request.param]()


def _stream(rng: random.Random, tok, n: int) -> list[int]:
    vocab = len(tok)
    specials = tok.all_special_ids + tok.convert_tokens_to_ids([ADDED])
    # Mostly random ids (random bytes: invalid and split UTF-8), some encoded text, some specials.
    ids: list[int] = []
    while len(ids) < n:
        r = rng.random()
        if r < 0.6:
            ids.append(rng.randrange(vocab))
        elif r < 0.85:
            ids += tok.encode(rng.choice(["héllo wörld", " 你好", "🙂🚀", " x² ≤ ∞", "  two  spaces"]), add_special_tokens=False)
        else:
            ids.append(rng.choice(specials))
    return ids[:n]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_deltas_concatenate_to_decode(tokenizer, skip_special_tokens: bool) -> None:
    rng = random.Random(1234)
    for _ in range(STREAMS):
        ids = _stream(rng, tokenizer, rng.randint(1, 40))
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        shown = ""
        i = 0
        while i < len(ids):
            step = rng.randint(1, 3)
            shown += detok.add(ids[i:i + step])
            i += step
            so_far = tokenizer.decode(ids[:i], skip_special_tokens=skip_special_tokens)
            assert so_far.startswith(shown), (ids[:i], shown, so_far)
        shown += detok.flush()
        assert shown == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), ids


def test_multibyte_character_waits_for_its_last_byte() -> None:
    tok = ALL["byte_level_bpe"]()
    ids = tok.encode("🙂", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    if len(ids) == 1:  # the corpus merged it: split it into its byte tokens instead
        ids = tok.convert_tokens_to_ids(list(tok.convert_ids_to_tokens(ids[0])))
    assert len(ids) > 1
    assert [detok.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1:]) == "🙂"
