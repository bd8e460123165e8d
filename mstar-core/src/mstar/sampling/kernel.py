"""The sampling math ``SlotSampler`` runs (``sample_batch``), one function for every batch.

Order of operations (per row, all rows at once):

1. penalties on the raw logits: repetition (HF: seen in prompt or output, logit>0 ->
   logit/p else logit*p), then presence/frequency (OpenAI, output tokens only:
   logit -= presence*(count>0) + frequency*count);
2. min_tokens: stop ids get -inf while fewer than min_tokens tokens were generated;
3. the token: argmax for greedy rows, else temperature, top_k, top_p (on the
   top-k-renormalised distribution), min_p (relative to the max probability) and an
   inverse-CDF draw with u = uniform(seed, step) — see ``mstar.sampling.draw``;
4. raw logprobs from the logits of step 2, when some row asked for them.

No RNG state: a row's token is a function of its logits, parameters and (seed, step)
only, whatever else is in the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mstar.sampling.draw import ceil_to_float32, draw_tokens, inverse_cdf
from mstar.sampling.tensors import SampleOutput, SamplingTensors, SeenTokens


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
    assert seen is not None
    if logits.device.type == "cpu":
        return penalise_seen(logits, st, seen, output_counts)
    return penalise_dense(logits, st, seen, output_counts)


def penalise_dense(logits: Tensor, st: SamplingTensors, seen: Tensor, counts: Tensor | None) -> Tensor:
    """Every token through the penalty formula (no-ops where unseen): no host sync."""
    rp = st.repetition_penalty.unsqueeze(1)
    logits = torch.where(seen, torch.where(logits > 0, logits / rp, logits * rp), logits)
    if counts is not None:
        penalty = st.presence_penalty.unsqueeze(1) * (counts > 0)
        penalty = penalty + st.frequency_penalty.unsqueeze(1) * counts
        logits = logits - penalty
    return logits


def penalise_seen(logits: Tensor, st: SamplingTensors, seen: Tensor, counts: Tensor | None) -> Tensor:
    """The same formula on the seen tokens only (prompt and output: a few hundred of a
    ~150k vocabulary); unseen tokens would only lose a zero. Costs a host sync."""
    rows, cols = seen.nonzero(as_tuple=True)
    at = counts[rows, cols] if counts is not None else torch.zeros_like(rows, dtype=torch.int32)
    return penalise_at(logits, st, SeenTokens(rows, cols, at))


def penalty_terms(st: SamplingTensors, seen: SeenTokens) -> tuple[Tensor, Tensor]:
    """The seen pairs' repetition penalties and presence + frequency terms (no logits
    needed: ``mstar_native::draw_main`` takes them from here)."""
    rows, c = seen.rows, seen.counts
    return st.repetition_penalty[rows], st.presence_penalty[rows] * (c > 0) + st.frequency_penalty[rows] * c


def penalise_at(logits: Tensor, st: SamplingTensors, seen: SeenTokens) -> Tensor:
    """Repetition, presence and frequency penalties at the given (row, token) pairs."""
    rows, cols = seen.rows, seen.cols
    rp, subtract = penalty_terms(st, seen)
    v = logits[rows, cols]
    v = torch.where(v > 0, v / rp, v * rp)
    v = v - subtract
    out = logits.clone()
    out[rows, cols] = v
    return out


def suppress_stop_tokens(logits: Tensor, st: SamplingTensors, stop_mask: Tensor | None) -> Tensor:
    """-inf on stop ids for rows that have not yet produced min_tokens tokens."""
    if stop_mask is None:
        return logits
    active = (st.num_generated < st.min_tokens).unsqueeze(1)
    return logits.masked_fill(stop_mask & active, float("-inf"))


__all__ = [
    "apply_penalties",
    "ceil_to_float32",
    "inverse_cdf",
    "penalise_at",
    "penalise_dense",
    "penalise_seen",
    "penalty_terms",
    "sample_batch",
    "suppress_stop_tokens",
]


def sample_batch(
    logits: Tensor,
    st: SamplingTensors,
    output_counts: Tensor | None = None,
    prompt_mask: Tensor | None = None,
    stop_mask: Tensor | None = None,
    seen: SeenTokens | None = None,
) -> SampleOutput:
    """Draw one token per row of ``logits`` [B, V] under per-row params ``st``.

    ``seen`` replaces ``output_counts``/``prompt_mask`` when the caller knows the
    penalised tokens sparsely (``SlotSampler`` on the CPU does).
    """
    if logits.dim() != 2 or logits.shape[0] != st.batch_size:
        raise ValueError(
            f"logits must be [B, V] with B={st.batch_size}, got {tuple(logits.shape)}"
        )
    x = logits.to(torch.float32)
    if seen is not None:
        x = penalise_at(x, st, seen)
    else:
        x = apply_penalties(x, st, output_counts, prompt_mask)
    x = suppress_stop_tokens(x, st, stop_mask)

    tokens = draw_tokens(x, st)

    # A full-vocabulary logsumexp costs as much as a greedy draw: only when asked for.
    lse = torch.logsumexp(x, dim=1, keepdim=True) if st.any_logprobs else None
    if lse is None:
        chosen = torch.full(tokens.shape, float("nan"), device=x.device)
    else:
        chosen = (x.gather(1, tokens.unsqueeze(1)) - lse).squeeze(1)
    top_ids = top_values = None
    if st.max_top_logprobs > 0:
        assert lse is not None  # top_logprobs > 0 implies logprobs
        n = min(st.max_top_logprobs, x.shape[1])
        values, top_ids = torch.topk(x, n, dim=1, sorted=True)
        top_values = values - lse
    return SampleOutput(tokens, chosen, top_ids, top_values)
