"""``mstar_native::draw_aux`` and ``draw_main`` (``mstar.sampling.native_draw``): the C++
draw of batches whose rows all sample with top_k alone (a main draw also with penalties and
min_tokens stop ids) must give the Python sampler's tokens, step counters, output counts and
seen sets bit for bit; every other batch must reach the Python sampler; compiled regions
use them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from mstar.native import native_module
from mstar.sampling import SamplingParams, draw, native_draw
from mstar.sampling.compiled_region import compile_region
from mstar.sampling.counter_rng import GOLDEN_GAMMA, uniform_of_keys
from mstar.sampling.multi_sampler import BatchSampler
from mstar.sampling.slot_sampler import SlotSampler
from test_sampling_fast_paths import logits_of
from test_sampling_multi import make_sampler, resolved

NATIVE = native_module()
# Skipped where the extension cannot be built; a failure under MSTAR_REQUIRE_NATIVE=1 (tests/core/conftest.py).
pytestmark = pytest.mark.usefixtures("native_ops")

TOP_K_ROWS = [
    [dict(temperature=0.9, top_k=50)] * 8,  # Qwen3-TTS's code predictor defaults
    [dict(temperature=1.0, top_k=50)],
    [dict(temperature=0.9, top_k=50), dict(temperature=1.0, top_k=7), dict(temperature=0.6, top_k=1)],
    [dict(temperature=1.3, top_k=5000), dict(temperature=0.8, top_k=3)] * 3,
]
OTHER_ROWS = [
    [dict(temperature=0.9, top_k=50), dict(temperature=0.0)],  # a greedy row
    [dict(temperature=0.9, top_k=50, top_p=0.8)],
    [dict(temperature=0.9, top_k=50), dict(temperature=1.0, top_k=20, min_p=0.05)],
    [dict(temperature=0.9)],
    [dict(temperature=0.9, top_k=50, repetition_penalty=1.3)],  # keeps output history
]


def _samplers(rows: list[dict], vocab: int) -> tuple[SlotSampler, SlotSampler]:
    pair = SlotSampler(12, vocab), SlotSampler(12, vocab)
    for s in pair:
        for i, p in enumerate(rows):
            s.add_request(2 + i, SamplingParams(**p), seed=(i * 7919 + 13) << (i % 40), prompt_ids=[i % vocab])
    return pair


def _raise(logits: torch.Tensor) -> torch.Tensor:
    raise AssertionError("the native draw called its fallback")


def _native(sampler: SlotSampler, logits, slots, advance, fallback=_raise) -> torch.Tensor:
    label = native_draw.label_id("test-native")
    NATIVE.bind_draws([None] * label + [(fallback, sampler.native_top_k_rows(slots, advance))], None)
    try:
        return torch.ops.mstar_native.draw_aux(logits, label, None)
    finally:
        NATIVE.unbind_draws()



# mstar_native exposes no mix64 of its own, so the C++ SplitMix64 (draws.cpp ``mix64``) is
# compared through the smallest op that runs it, ``draw_aux``: a row whose key is
# z - gamma at step 0 draws with u = (mix64(z) >> 11) * 2**-53. Its token shows where u
# falls in the row's CDF, so the rows are built to resolve u finely around the u the
# Python mix64 gives: blocks of 256 tokens of weights 1, 1/200, ..., 1/200**3, each split
# around that u, and a window of 256 tokens of weight 1/200**4 between the halves. A token
# then fixes u to about 2**-38, i.e. mix64's bits 27-63, which its last xorshift (>> 31)
# reaches too.
_LEVELS, _WIDTH = 5, 256
_MASK64 = (1 << 64) - 1


def _level_logits() -> torch.Tensor:
    return (-torch.arange(_LEVELS, dtype=torch.float64) * torch.log(torch.tensor(200.0, dtype=torch.float64))).float()


def _zoomed_logits(u: float) -> tuple[torch.Tensor, int]:
    """One row's logits whose CDF resolves ``u`` finely; the window's first index."""
    logits = _level_logits()
    weights = logits.exp().tolist()  # the op's own float32 exps, exactly
    rest = u * _WIDTH * sum(weights)
    before = []
    for level in range(_LEVELS - 1):
        count = min(_WIDTH, int(rest // weights[level]))
        rest -= count * weights[level]
        before.append(count)
    head = [logits[level].repeat(c) for level, c in enumerate(before)]
    tail = [logits[level].repeat(_WIDTH - c) for level, c in reversed(list(enumerate(before)))]
    return torch.cat([*head, logits[-1].repeat(_WIDTH), *tail]), sum(before)


def test_the_cpp_mix64_equals_the_python_one():
    gen = torch.Generator().manual_seed(64)
    edges = [0, _MASK64, 1, 1 << 63, (1 << 63) - 1, GOLDEN_GAMMA & _MASK64, *(1 << b for b in range(64))]
    randoms = [int(v) & _MASK64 for v in torch.randint(-(2**63), 2**63 - 1, (4096 - len(edges),), generator=gen)]
    zs = edges + randoms
    in_window = 0
    for start in range(0, len(zs), 1024):
        z = zs[start : start + 1024]
        rows = len(z)
        keys = [(v - GOLDEN_GAMMA) & _MASK64 for v in z]  # step 0: the op mixes key + gamma = z
        u = uniform_of_keys(keys, [0] * rows)  # the Python mix64
        built = [_zoomed_logits(v) for v in u]
        x = torch.stack([row for row, _ in built])
        vocab = x.shape[1]
        want = draw._draw_top_k(x, torch.ones(rows, 1), vocab, torch.tensor(u, dtype=torch.float64), False, vocab)
        window = torch.tensor([first for _, first in built])
        in_window += int(((want >= window) & (want < window + _WIDTH)).sum())
        top_k_rows = (torch.zeros(rows, dtype=torch.int64), torch.arange(rows), torch.zeros(rows, dtype=torch.int64),
                      keys, torch.ones(rows, 1), False, torch.full((rows, 1), vocab), vocab, vocab)
        label = native_draw.label_id("test-native-mix64")
        NATIVE.bind_draws([None] * label + [(_raise, top_k_rows)], None)
        try:
            got = torch.ops.mstar_native.draw_aux(x, label, None)
        finally:
            NATIVE.unbind_draws()
        differ = (got != want).nonzero().flatten().tolist()
        assert not differ, [(hex(z[i]), int(got[i]), int(want[i])) for i in differ[:5]]
    assert in_window > 0.95 * len(zs)  # the test keeps its resolution: u lands in the window

@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "suppressed"])
@pytest.mark.parametrize("vocab", [11, 256, 2048, 3072])
@pytest.mark.parametrize("case", range(len(TOP_K_ROWS)))
def test_top_k_batches_draw_the_python_samplers_tokens_and_steps(kind, vocab, case):
    rows = TOP_K_ROWS[case]
    python, native = _samplers(rows, vocab)
    slots = torch.arange(2, 2 + len(rows))
    gen = torch.Generator().manual_seed(vocab * 31 + case)
    for step in range(6):
        if kind == "suppressed":  # the talker's shape: -inf beyond the first eighth
            x = torch.randn(len(rows), vocab, generator=gen) * 3
            x[:, max(1, vocab // 8):] = float("-inf")
        else:
            x = logits_of(kind, len(rows), vocab, gen)
        advance = None if step % 3 else torch.arange(len(rows)) % 2 == 0  # some rows stay put
        want = python.sample(x, slots, advance).tokens
        got = _native(native, x, slots, advance)
        assert torch.equal(got, want), (step, got, want)
        assert torch.equal(native.step_counters, python.step_counters)


@pytest.mark.parametrize("case", range(len(OTHER_ROWS)))
def test_other_batches_are_drawn_by_the_python_sampler(case):
    rows = OTHER_ROWS[case]
    python, native = _samplers(rows, 256)
    slots = torch.arange(2, 2 + len(rows))
    assert native.native_top_k_rows(slots) is None
    calls = []

    def fallback(logits: torch.Tensor) -> torch.Tensor:
        calls.append(logits.shape)
        return native.sample(logits, slots).tokens

    gen = torch.Generator().manual_seed(case)
    for _ in range(3):
        x = logits_of("peaked", len(rows), 256, gen)
        assert torch.equal(_native(native, x, slots, None, fallback), python.sample(x, slots).tokens)
    assert len(calls) == 3
    assert torch.equal(native.step_counters, python.step_counters)


def test_a_draw_with_nothing_bound_says_so():
    label = native_draw.label_id("test-native-unbound")
    with pytest.raises(RuntimeError, match="no sampler bound"):
        torch.ops.mstar_native.draw_aux(torch.zeros(2, 5), label, None)


MAIN_ROWS = [
    [dict(temperature=0.9, top_k=50, repetition_penalty=1.05, min_tokens=2)] * 8,  # Qwen3-TTS's talker
    [dict(temperature=1.0, top_k=5, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
     dict(temperature=0.7, top_k=3, min_tokens=3), dict(temperature=1.0, top_k=8)],
    [dict(temperature=0.8, top_k=4, min_tokens=4)] * 3,  # stop ids, no penalties kept
    [dict(temperature=1.2, top_k=6)] * 2,  # neither: the aux path's state only
]
STOP = 3  # every row's stop id; the largest logit of each step below


def _main_samplers(rows: list[dict], vocab: int) -> tuple[SlotSampler, SlotSampler]:
    pair = SlotSampler(12, vocab), SlotSampler(12, vocab)
    for s in pair:
        for i, p in enumerate(rows):
            s.add_request(2 + i, SamplingParams(**p), seed=i * 104729 + 5, prompt_ids=[(5 * i + 1) % vocab, 7],
                          stop_ids=[STOP])
    return pair


def _native_main(sampler: SlotSampler, logits, slots, advance, fallback=_raise) -> torch.Tensor:
    NATIVE.bind_main(fallback, sampler.native_main_rows(slots, advance))
    try:
        out = torch.ops.mstar_native.draw_main(logits, None)
    finally:
        drawn = NATIVE.unbind_draws()
    if drawn is not None:
        assert drawn is not None and torch.equal(drawn, out)
        sampler.note_drawn(slots, drawn, advance)
    return out


# Small k over 3072 ids takes draw_cpu's candidate path instead (not native): the talker's k only.
@pytest.mark.parametrize(("case", "vocab"), [(c, v) for c in range(len(MAIN_ROWS)) for v in (16, 1024)] + [(0, 3072)])
def test_main_draws_with_penalties_and_stop_ids_equal_the_python_samplers(case, vocab):
    rows = MAIN_ROWS[case]
    python, native = _main_samplers(rows, vocab)
    slots = torch.arange(2, 2 + len(rows))
    gen = torch.Generator().manual_seed(vocab + case)
    for step in range(8):
        x = torch.randn(len(rows), vocab, generator=gen)
        x[:, STOP] = 8.0  # drawn at once unless min_tokens suppresses it
        x[:, 7] = 4.0 - 8.0 * (step % 2)  # a prompt token, penalised both ways (logit > 0 and < 0)
        advance = None if step % 3 else torch.arange(len(rows)) % 2 == 0
        want = python.sample(x, slots, advance).tokens
        got = _native_main(native, x, slots, advance)
        assert torch.equal(got, want), (step, got, want)
        assert torch.equal(native.step_counters, python.step_counters)
        assert (native.output_counts is None) == (python.output_counts is None)
        if python.output_counts is not None:
            assert torch.equal(native.output_counts, python.output_counts)
        assert native._seen == python._seen


def test_main_batches_with_other_rows_are_drawn_by_the_python_sampler():
    rows = [dict(temperature=0.9, top_k=50, repetition_penalty=1.1), dict(temperature=0.0)]
    python, native = _main_samplers(rows, 64)
    slots = torch.arange(2, 4)
    assert native.native_main_rows(slots) is None
    calls = []

    def fallback(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return native.sample(logits, slots).tokens

    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        x = torch.randn(2, 64, generator=gen)
        assert torch.equal(_native_main(native, x, slots, None, fallback), python.sample(x, slots).tokens)
    assert len(calls) == 3 and native._seen == python._seen


def test_a_main_draw_of_the_wrong_shape_or_unbound_says_so():
    python, native = _main_samplers(MAIN_ROWS[1], 16)
    NATIVE.bind_main(_raise, native.native_main_rows(torch.arange(2, 5)))
    try:
        with pytest.raises(ValueError, match=r"logits must be \[3, 16\]"):
            torch.ops.mstar_native.draw_main(torch.zeros(3, 15), None)
    finally:
        assert NATIVE.unbind_draws() is None
    with pytest.raises(RuntimeError, match="no sampler bound"):
        torch.ops.mstar_native.draw_main(torch.zeros(3, 16), None)


TABLE = torch.randn(24, 16, generator=torch.Generator().manual_seed(5))
MAIN_TABLE = torch.randn(40, 16, generator=torch.Generator().manual_seed(6))


def frame(inputs: dict[str, torch.Tensor], sampler) -> dict[str, torch.Tensor]:
    """A talker frame's shape: the main draw, then a depth loop of aux draws after it."""
    first = sampler.sample(torch.tanh(inputs["h"]) @ MAIN_TABLE.T).tokens
    h = inputs["h"] + MAIN_TABLE[first]
    return {"first": first, "codes": depth_loop({"h": h}, sampler)["codes"]}


def test_a_compiled_region_draws_main_rows_natively_and_as_eager_does(monkeypatch):
    calls = []
    for cls in (native_draw._Fallback, native_draw._MainFallback):
        real = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, logits, real=real: calls.append(1) or real(self, logits))
    compiled = compile_region(frame, cpp_wrapper=True)

    def bound(rows: int):
        sampler = make_sampler(max_slots=8)  # main: temperature 0.7, top_k 50 over 40 ids
        for slot in range(rows):
            sampler.add_request(slot, resolved({"main": {"seed": 70 + slot, "repetition_penalty": 1.2,
                                                         "min_tokens": 2}}), prompt_ids=[1, 2], eos_ids=[0])
        return sampler, sampler.bind(torch.arange(rows))

    for rows in (3, 5):
        (eager, _), (comp, _) = bound(rows), bound(rows)
        for step in range(3):
            inputs = {"h": torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows * 10 + step))}
            eager_batch, comp_batch = eager.bind(torch.arange(rows)), comp.bind(torch.arange(rows))
            got, want = compiled(inputs, comp_batch), frame(inputs, eager_batch)
            assert torch.equal(got["first"], want["first"]) and torch.equal(got["codes"], want["codes"])
            assert torch.equal(comp_batch.last_main_tokens, eager_batch.last_main_tokens)
        for label in ("main", "talker"):
            assert torch.equal(comp.samplers[label].step_counters, eager.samplers[label].step_counters)
        assert torch.equal(comp.samplers["main"].output_counts, eager.samplers["main"].output_counts)
        assert comp.samplers["main"]._seen == eager.samplers["main"]._seen
    assert calls == []  # every draw was a C++ one



def depth_loop(inputs: dict[str, torch.Tensor], sampler) -> dict[str, torch.Tensor]:
    """A code predictor's shape: each aux draw feeds the next one's logits."""
    h, codes = inputs["h"], []
    for _ in range(4):
        code = sampler.sample_aux("talker", torch.tanh(h) @ TABLE.T).tokens
        h = h + TABLE[code]
        codes.append(code)
    return {"codes": torch.stack(codes, dim=1)}


def test_a_compiled_region_draws_top_k_rows_natively_and_as_eager_does(monkeypatch):
    calls, main_binds = [], []
    real = native_draw._Fallback.__call__
    monkeypatch.setattr(native_draw._Fallback, "__call__", lambda self, logits: calls.append(1) or real(self, logits))
    real_rows = BatchSampler.native_main_rows
    monkeypatch.setattr(BatchSampler, "native_main_rows", lambda self: main_binds.append(1) or real_rows(self))
    compiled = compile_region(depth_loop, cpp_wrapper=True)

    def bound(rows: int):
        sampler = make_sampler(max_slots=8)  # "talker": temperature 0.9, top_k 3
        for slot in range(rows):
            sampler.add_request(slot, resolved({"aux": {"talker": {"seed": 40 + slot}}}))
        return sampler, sampler.bind(torch.arange(rows))

    for rows in (3, 5):
        inputs = {"h": torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows))}
        (eager, eager_batch), (comp, comp_batch) = bound(rows), bound(rows)
        for _ in range(2):
            assert torch.equal(compiled(inputs, comp_batch)["codes"], depth_loop(inputs, eager_batch)["codes"])
        assert torch.equal(comp.samplers["talker"].step_counters, eager.samplers["talker"].step_counters)
    assert calls == []  # every draw was the C++ one
    # No main draw in this region: the main rows were gathered only before it was first traced.
    assert main_binds == [1]


def test_a_thread_that_drew_natively_exits_cleanly():
    """The op's per-thread state holds no Python object once unbound: one released at
    thread exit, without the GIL, aborts the process (an engine thread ending did)."""
    code = (
        "import threading\n"
        "from mstar.native import native_module\n"
        "m = native_module()\n"
        "def work():\n"
        "    m.bind_draws([None], lambda label: None)\n"
        "    m.unbind_draws()\n"
        "t = threading.Thread(target=work)\n"
        "t.start(); t.join()\n"
        "print('exited')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "exited" in done.stdout, done.stderr[-2000:]
