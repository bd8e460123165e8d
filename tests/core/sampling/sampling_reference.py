"""Independent reference formulas for the sampling tests (plain numpy / Python ints).

Nothing here imports the code under test, so the tests compare two implementations.
"""

from __future__ import annotations

import numpy as np

U64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64_mix(z: int) -> int:
    z &= U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def counter_bits(seed: int, step: int) -> int:
    """Unsigned 64-bit output for (seed, step): step-th SplitMix64 draw of state mix(seed)."""
    return splitmix64_mix(splitmix64_mix(seed) + (step + 1) * GAMMA)


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    e = np.where(finite, np.exp(x - x[finite].max()), 0.0)
    return e / e.sum()


def filtered_distribution(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> np.ndarray:
    """Exact sampling distribution: temperature, top-k, top-p, min-p, renormalise."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(logits)
        out[int(np.argmax(logits))] = 1.0
        return out
    p = softmax(logits / temperature)
    keep = p > 0
    order = np.argsort(-p, kind="stable")
    if top_k > 0:
        keep[order[top_k:]] = False
    if top_p < 1:
        q = np.where(keep, p, 0.0)
        q = q / q.sum()
        cum_before = 0.0
        for i in order:
            if not keep[i]:
                continue
            if cum_before >= top_p:
                keep[i] = False
            else:
                # Guard the reference itself against float-ambiguous cut points.
                assert abs(cum_before - top_p) > 1e-6, "test case too close to top_p cut"
            cum_before += q[i]
    if min_p > 0:
        keep &= p >= min_p * p.max()
    out = np.where(keep, p, 0.0)
    return out / out.sum()


def penalised_logits(
    logits: list[float],
    output_tokens: list[int],
    prompt_tokens: list[int],
    repetition: float,
    presence: float,
    frequency: float,
) -> list[float]:
    """HF repetition penalty over prompt+output, then OpenAI presence/frequency over output."""
    out = []
    for tok, value in enumerate(logits):
        count = output_tokens.count(tok)
        if count > 0 or tok in prompt_tokens:
            value = value / repetition if value > 0 else value * repetition
        value -= presence * (1 if count > 0 else 0) + frequency * count
        out.append(value)
    return out


def log_softmax(x: list[float]) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x[np.isfinite(x)].max()
    return x - (m + np.log(np.sum(np.exp(x[np.isfinite(x)] - m))))


class Ambiguous(Exception):
    """The reference's float64 answer is too close to a boundary to compare bit for bit."""


def reference_uniform(seed: int, step: int) -> float:
    return (counter_bits(seed, step) >> 11) * 2.0**-53


def reference_draw(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
    seed: int, step: int, margin: float = 1e-6,
) -> int:
    """The token of one row, from the written contract, by full sort and float64 sums.

    Greedy: first index of the maximum. Else d = (x - max) / T in float32 (the contract's
    scaled logits, so ties are the kernel's), w = exp(d) in float64; top_k keeps d >= its
    k-th largest value, top_p the tokens (descending d) whose preceding mass is below
    top_p times the top-k mass (or the total), min_p keeps w >= min_p; the token is the
    first one in vocabulary order whose cumulative kept weight exceeds u * total.
    Raises Ambiguous when a comparison is within ``margin`` (relative) of flipping.
    """
    x = np.asarray(logits, dtype=np.float32)
    if temperature == 0:
        return int(np.argmax(x))
    d = (x - x.max()) / np.float32(temperature)
    w = np.exp(d.astype(np.float64))
    order = np.argsort(-d, kind="stable")
    ds, ws = d[order], w[order]
    vocab = len(x)
    k = min(top_k, vocab) if top_k > 0 else vocab
    mass = ws[:k].sum() if top_k > 0 else w.sum()
    n = k
    if top_p < 1:
        before = 0.0
        for j in range(k):
            # Near the cut, stopping at j or j+1 gives the same threshold inside a tie.
            if abs(before - top_p * mass) < margin * mass and ds[j - 1] != ds[j]:
                raise Ambiguous("top_p cut")
            if before >= top_p * mass:
                n = j
                break
            before += ws[j]
    n = max(n, 1)
    keep = d >= ds[n - 1]
    if min_p > 0:
        if np.any(keep & (np.abs(w - min_p) < margin * min_p)):
            raise Ambiguous("min_p cut")
        keep &= w >= min_p
    kept = np.where(keep, w, 0.0)
    cdf = np.cumsum(kept)
    target = reference_uniform(seed, step) * cdf[-1]
    if np.min(np.abs(cdf - target)) < margin * cdf[-1]:
        raise Ambiguous("draw")
    return int(np.searchsorted(cdf, target, side="right"))
