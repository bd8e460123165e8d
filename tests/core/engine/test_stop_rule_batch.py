"""``StopRule.apply`` over whole batches equals the rule written out row by row from its
documented meaning, over random requests, tokens and steps (slots joining and leaving)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mstar.engine.stop_rules import StopRule, merge
from mstar.model.spec import NodeSamplers
from mstar.model.submodule_base import STOP_ALL, StopCheck
from mstar.sampling.params import SamplingParams

ENDS = (7, 9)
MAX_LEN = 40


def expected(params: SamplingParams | None, generated: int, token: int, cache_len: int, outputs: tuple[str, ...]):
    if params is None or token < 0:
        return None
    stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(ENDS))
    if token in stop_ids and generated >= params.min_tokens:
        return StopCheck(frozenset({STOP_ALL}), outputs, "stop")
    if generated + 1 >= params.max_tokens or cache_len + 1 > MAX_LEN:
        return StopCheck(frozenset({STOP_ALL}), (), "length")
    return None


@pytest.mark.parametrize("seed", range(6))
def test_batches_equal_the_rule_row_by_row(seed: int) -> None:
    rng = random.Random(seed)
    slots = 16
    rule = StopRule(NodeSamplers(vocab_size=12, main=SamplingParams(), stop_token_ids=ENDS), slots, MAX_LEN)
    live: dict[int, tuple[SamplingParams | None, int]] = {}  # slot -> (params, generated)
    checked = stops = 0
    for _ in range(60):
        for slot in range(slots):  # leave and join
            if slot in live and rng.random() < 0.1:
                rule.remove(slot)
                del live[slot]
            elif slot not in live and rng.random() < 0.3:
                max_tokens = rng.randint(1, 12)
                params = None if rng.random() < 0.1 else SamplingParams(
                    max_tokens=max_tokens,
                    min_tokens=min(max_tokens, rng.choice([0, 0, 2])),
                    ignore_eos=rng.random() < 0.3,
                    stop_token_ids=rng.sample(range(12), rng.randint(0, 4)),
                )
                rule.add(slot, params)
                live[slot] = (params, 0)
        batch = rng.sample(sorted(live), rng.randint(0, len(live)))
        if not batch:
            continue
        tokens = np.array([rng.choice([-1, *range(12)]) for _ in batch])
        cache_lens = [rng.randint(1, MAX_LEN) for _ in batch]
        outputs = [(f"out{s}",) for s in batch]
        got = rule.apply(batch, tokens, cache_lens, outputs)
        for i, slot in enumerate(batch):
            params, generated = live[slot]
            assert got[i] == expected(params, generated, int(tokens[i]), cache_lens[i], outputs[i]), (slot, params, generated)
            assert rule.generated(slot) == generated + 1
            live[slot] = (params, generated + 1)
            checked += 1
            stops += got[i] is not None
    assert checked > 300 and 0 < stops < checked


def test_withhold_on_stop_names_what_is_withheld() -> None:
    decl = NodeSamplers(vocab_size=12, main=SamplingParams(), stop_token_ids=ENDS, withhold_on_stop=("token",))
    rule = StopRule(decl, 2, None)
    rule.add(0, SamplingParams(max_tokens=5))
    rule.add(1, SamplingParams(max_tokens=5, ignore_eos=True))
    got = rule.apply([0, 1], np.array([7, 7]), [3, 3], [("token", "codes"), ("token", "codes")])
    assert got == [StopCheck(frozenset({STOP_ALL}), ("token",), "stop"), None]


def test_merge_keeps_both_and_cores_reason() -> None:
    core = StopCheck(frozenset({STOP_ALL}), ("a",), "length")
    plugin = StopCheck(frozenset({"loop"}), ("a", "b"), "stop")
    assert merge(core, plugin) == StopCheck(frozenset({STOP_ALL, "loop"}), ("a", "b"), "length")
    assert merge(None, plugin) == plugin and merge(core, None) == core
    assert merge(None, None) == StopCheck()
