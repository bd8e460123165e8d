"""The official token -> code -> window rule, piece by piece."""

from __future__ import annotations

import torch
from mstar_orpheus.audio_codes import OrpheusWindows, tokens_to_codes, valid_windows, window_levels
from mstar_orpheus.noise import CodeSeededNoise, window_seeds
from orpheus_reference import _window_to_snac_codes

BASE, BOOK = 128256, 4096


def _codes(tokens: list[int], counts: list[int]) -> tuple[list[int], list[bool]]:
    code, ok = tokens_to_codes(torch.tensor(tokens), torch.tensor(counts), BASE, BOOK)
    return code.tolist(), ok.tolist()


def test_audio_tokens_become_codes_by_position():
    tokens = [BASE + 10 + 5, BASE + 10 + BOOK + 3, BASE + 10 + 6 * BOOK + 4095, BASE + 10 + 9]
    assert _codes(tokens, [0, 1, 6, 7]) == ([5, 3, 4095, 9], [True, True, True, True])


def test_non_audio_tokens_and_non_positive_codes_are_dropped():
    # a text token, end-of-speech (<custom_token_2>), code 0, a band below the position
    tokens = [100, BASE + 2, BASE + 10, BASE + 10 + 7]
    code, ok = _codes(tokens, [0, 0, 0, 1])
    assert ok == [False, False, False, False]
    # A band above the position is accepted (official rule) but out of the codebook.
    code, ok = _codes([BASE + 10 + 2 * BOOK + 1], [0])
    assert ok == [True] and code == [2 * BOOK + 1]


def test_windows_every_seven_codes_from_the_28th_without_tail_flush():
    policy = OrpheusWindows()
    cuts, consumed = [], 0
    for available in range(1, 60):
        cut = policy.next_chunk(available, consumed, closed=False)
        if cut is not None:
            cuts.append((available, cut[:2]))
            consumed = cut[1]
    assert cuts == [(28, (0, 28)), (35, (7, 35)), (42, (14, 42)), (49, (21, 49)), (56, (28, 56))]
    assert policy.next_chunk(59, 56, closed=True) is None


def test_window_levels_match_the_official_frame_layout():
    window = torch.randint(0, BOOK, (1, 28))
    ours = window_levels(window)
    official = _window_to_snac_codes(window[0].tolist())
    assert [o.tolist() for o in ours] == [r.tolist() for r in official]
    assert [o.shape[1] for o in ours] == [4, 8, 16]


def test_windows_with_codes_outside_the_codebook_are_invalid():
    good = torch.randint(1, BOOK, (28,))
    bad = good.clone()
    bad[5] = BOOK + 7
    assert valid_windows(torch.stack([good, bad]), BOOK).tolist() == [True, False]


def test_code_seeded_noise_is_a_pure_function_of_the_window():
    a, b = torch.randint(0, BOOK, (2, 28))
    seeds = window_seeds(torch.stack([a, b, a]))
    noise = CodeSeededNoise(seeds)(block=1, batch=3, length=4096)
    assert torch.equal(noise[0], noise[2]) and not torch.equal(noise[0], noise[1])
    assert torch.equal(CodeSeededNoise(window_seeds(a[None]))(1, 1, 4096)[0], noise[0])  # batch-free
    assert not torch.equal(CodeSeededNoise(seeds)(block=2, batch=3, length=4096), noise)
    assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1) < 0.05
