"""The sampling math shared by the eager and the graph-safe sampler.

Order of operations (per row, all rows at once):

1. penalties on the raw logits: repetition (HF: seen in prompt or output, logit>0 ->
   logit/p else logit*p), then presence/frequency (OpenAI, output tokens only:
   logit -= presence*(count>0) + frequency*count);
2. min_tokens: stop ids get -inf while fewer than min_tokens tokens were generated;
3. raw logprobs and the greedy argmax are taken from these logits;
4. temperature, softmax;
5. top_k, top_p (on the top-k-renormalised distribution), min_p (relative to the
   max probability, so unaffected by renormalisation) -> keep mask;
6. renormalise and draw by inverse CDF in vocab order with u = uniform(seed, step).

Everything is batched tensor ops: no host sync, no per-row Python, no RNG state.
Rows whose parameters disable a step go through it as exact no-ops (x/1, x*1,
x-0, threshold 0), which is why eager and graph-safe paths agree bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mstar.sampling.counter_rng import uniform
from mstar.sampling.tensors import SampleOutput, SamplingTensors


def apply_penalties(
    logits: Tensor,
    st: SamplingTensors,
    output_counts: Tensor | None,
    prompt_mask: Tensor | None,
) -> Tensor:
    """Repetition, then presence/frequency penalties. ``logits`` is float32 [B, V]."""
    if output_counts is None and prompt_mask is None:
        return logits
    seen_out = output_counts > 0 if output_counts is not None else None
    if seen_out is None:
        seen = prompt_mask
    elif prompt_mask is None:
        seen = seen_out
    else:
        seen = seen_out | prompt_mask
    rp = st.repetition_penalty.unsqueeze(1)
    logits = torch.where(seen, torch.where(logits > 0, logits / rp, logits * rp), logits)
    if output_counts is not None:
        penalty = st.presence_penalty.unsqueeze(1) * seen_out
        penalty = penalty + st.frequency_penalty.unsqueeze(1) * output_counts
        logits = logits - penalty
    return logits


def suppress_stop_tokens(logits: Tensor, st: SamplingTensors, stop_mask: Tensor | None) -> Tensor:
    """-inf on stop ids for rows that have not yet produced min_tokens tokens."""
    if stop_mask is None:
        return logits
    active = (st.num_generated < st.min_tokens).unsqueeze(1)
    return logits.masked_fill(stop_mask & active, float("-inf"))


def _ceil_to_float32(x: Tensor) -> Tensor:
    """Smallest float32 >= x (float64), so `p32 >= result` equals `p32 >= x` exactly."""
    x32 = x.to(torch.float32)
    up = torch.nextafter(x32, torch.full_like(x32, float("inf")))
    return torch.where(x32.to(torch.float64) < x, up, x32)


_CPU_PREFIX = 1024  # top-k/top-p cut-offs usually lie within the first ~1k sorted tokens


def keep_threshold(probs: Tensor, st: SamplingTensors) -> Tensor:
    """float32 [B, 1]: tokens with prob >= this survive top_k, top_p and min_p.

    top_k/top_p work on a sorted copy and become a single probability threshold,
    so tokens tied at the boundary are all kept. The sort is skipped when no row
    uses them; the threshold is then 0, exactly what those rows get anyway.

    On the CPU a full sort of a 150k vocabulary dominates a decode step, so the cut-off
    is first sought in the top ``_CPU_PREFIX`` values (``topk``); only when some row's
    cut-off lies beyond them does the full sort run. Both paths give every row the same
    value (the prefix of a descending sort is the same, and the total mass is summed the
    same way), so a row's result never depends on its batch.
    """
    batch, vocab = probs.shape
    pmax = probs.amax(dim=1, keepdim=True)
    min_p_thresh = _ceil_to_float32(st.min_p.unsqueeze(1) * pmax.to(torch.float64))
    if not st.needs_sort:
        return min_p_thresh
    total = probs.sum(dim=1, keepdim=True, dtype=torch.float64)
    if probs.device.type == "cpu" and vocab > _CPU_PREFIX:
        prefix = torch.topk(probs, _CPU_PREFIX, dim=1, sorted=True).values
        n, covered = _cut(prefix, total, st, vocab)
        if bool(covered.all()):  # a host read, free on the CPU
            return torch.maximum(prefix.gather(1, n - 1), min_p_thresh)
    sorted_p = torch.sort(probs, dim=1, descending=True).values
    n, _ = _cut(sorted_p, total, st, vocab)
    return torch.maximum(sorted_p.gather(1, n - 1), min_p_thresh)


def _cut(sorted_p: Tensor, total: Tensor, st: SamplingTensors, vocab: int) -> tuple[Tensor, Tensor]:
    """(n [B,1]: how many of the largest tokens top_k/top_p keep, covered [B,1]: whether
    ``sorted_p`` — the first L values of the descending sort — was long enough to tell)."""
    length = sorted_p.shape[1]
    cum = torch.cumsum(sorted_p, dim=1, dtype=torch.float64)
    k = torch.where(st.top_k > 0, st.top_k.clamp(max=vocab), vocab).unsqueeze(1)
    # Disabled top_k: the whole mass, summed the same way on every path.
    mass_k = torch.where(k < vocab, cum.gather(1, (k.clamp(max=length) - 1)), total)
    # Exclusive cumsum: a token is in the nucleus while the mass before it < top_p.
    before = torch.nn.functional.pad(cum[:, :-1], (1, 0))
    n_p = (before < st.top_p.unsqueeze(1) * mass_k).sum(dim=1, keepdim=True)
    top_p_off = st.top_p.unsqueeze(1) >= 1.0
    # Known from the prefix: a top_k within it, or no top_k and a nucleus ending inside it.
    covered = (k <= length) | ((k >= vocab) & (n_p < length) & ~top_p_off)
    # top_p == 1 must keep everything even where float cumsums saturate early.
    n_p = torch.where(top_p_off, vocab, n_p)
    n = torch.minimum(k, n_p.clamp(min=1)).clamp(max=length)
    return n, covered


def inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """int64 [B]: the first index whose cumulative weight exceeds u*total.

    float64 cumsum because float32 only resolves ~1e-7 near 1.0, which would
    distort the tail of a 150k-token vocabulary. The chosen index is guaranteed
    to have positive weight: float rounding could otherwise land on a
    zero-weight index (u*total rounding up to total, or a parallel scan that is
    not exactly flat across zeros); those rows fall back to the last positive one.
    """
    vocab = weights.shape[1]
    cdf = torch.cumsum(weights, dim=1, dtype=torch.float64)
    target = u.unsqueeze(1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).clamp(max=vocab - 1)
    positive = weights > 0
    ok = positive.gather(1, idx).squeeze(1)
    last_positive = (vocab - 1) - positive.flip(1).to(torch.uint8).argmax(dim=1)
    return torch.where(ok, idx.squeeze(1), last_positive)


def sample_batch(
    logits: Tensor,
    st: SamplingTensors,
    output_counts: Tensor | None = None,
    prompt_mask: Tensor | None = None,
    stop_mask: Tensor | None = None,
) -> SampleOutput:
    """Draw one token per row of ``logits`` [B, V] under per-row params ``st``."""
    if logits.dim() != 2 or logits.shape[0] != st.batch_size:
        raise ValueError(
            f"logits must be [B, V] with B={st.batch_size}, got {tuple(logits.shape)}"
        )
    x = logits.to(torch.float32)
    x = apply_penalties(x, st, output_counts, prompt_mask)
    x = suppress_stop_tokens(x, st, stop_mask)

    lse = torch.logsumexp(x, dim=1, keepdim=True)
    greedy_tokens = x.argmax(dim=1)

    # Greedy rows run the sampling path with T=1 (result discarded) to stay branch-free.
    greedy = st.temperature == 0
    temp = torch.where(greedy, 1.0, st.temperature).unsqueeze(1)
    probs = torch.softmax(x / temp, dim=1)
    kept = probs.masked_fill(probs < keep_threshold(probs, st), 0.0)
    sampled = inverse_cdf(kept, uniform(st.seed, st.step))
    tokens = torch.where(greedy, greedy_tokens, sampled)

    chosen = (x.gather(1, tokens.unsqueeze(1)) - lse).squeeze(1)
    top_ids = top_values = None
    if st.max_top_logprobs > 0:
        n = min(st.max_top_logprobs, x.shape[1])
        values, top_ids = torch.topk(x, n, dim=1, sorted=True)
        top_values = values - lse
    return SampleOutput(tokens, chosen, top_ids, top_values)
