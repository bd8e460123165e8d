"""One token per row of penalised logits: what each row draws, and what that costs.

Per row, with ``x`` the float32 logits and ``m`` their maximum:

- temperature 0: the first index of the maximum (``torch.argmax``'s rule);
- otherwise the scaled logits are ``d = (x - m) / T`` and the weights ``w = exp(d)``
  (float32; the largest is exactly 1). top_k keeps ``d >= `` its k-th largest value;
  top_p keeps, in descending order of ``d``, the tokens whose preceding mass is below
  ``top_p`` times the mass of the top-k set (the whole vocabulary without top_k); both
  become one threshold on ``d``, so tokens tied at a boundary are all kept. min_p keeps
  ``w >= min_p``. The token is drawn by inverse CDF over the kept weights in vocabulary
  order with ``u = uniform(seed, step)``.

That definition never mentions the batch, and every path below computes it exactly, so
a row draws the same token whichever rows share its call. On the CPU rows are split by
kind (host reads are free there): greedy rows cost one pass for group maxima plus a
few dozen gathered logits; filtered rows order only a candidate set (the top groups of
``vocab_groups``, then a ``topk`` of the row) that grows until it provably holds
everything they keep, plus one pass for the total mass when top_p is used without top_k. Elsewhere (CUDA) the draw is
branch-free and sync-free so it can be captured in a graph: argmax for every row, and
the same math over the whole vocabulary (a full sort only when a row uses top_k/top_p).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from mstar.sampling.counter_rng import uniform
from mstar.sampling.tensors import SamplingTensors
from mstar.sampling.vocab_groups import GROUP, VocabGroups

_GREEDY_GROUPS = 4  # the maximum is in the top group unless it is tied across groups
_FIRST_GROUPS = 64  # a first candidate set of ~1k tokens holds a peaked nucleus
_FIRST_WIDTH = 4096  # then ordered prefixes of the whole row, before a full sort
_GROWTH = 4


def ceil_to_float32(x: Tensor) -> Tensor:
    """Smallest float32 >= x (float64), so `w32 >= result` equals `w32 >= x` exactly."""
    x32 = x.to(torch.float32)
    up = torch.nextafter(x32, torch.full_like(x32, float("inf")))
    return torch.where(x32.to(torch.float64) < x, up, x32)


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


@dataclass(frozen=True)
class _Rows:
    """Parameters of the sampled rows, as columns ([b, 1]) ready to broadcast."""

    temperature: Tensor  # float32
    top_k: Tensor  # int64, <= 0 = off
    top_p: Tensor  # float64
    min_p: Tensor  # float32, ceil of the float64 value
    u: Tensor  # float64 [b]

    @classmethod
    def of(cls, st: SamplingTensors, temperature: Tensor) -> _Rows:
        return cls(
            temperature.unsqueeze(1),
            st.top_k.unsqueeze(1),
            st.top_p.unsqueeze(1),
            ceil_to_float32(st.min_p.unsqueeze(1)),
            uniform(st.seed, st.step),
        )

    def take(self, rows: Tensor) -> _Rows:
        return _Rows(*(getattr(self, f.name).index_select(0, rows) for f in fields(self)))


def _scaled(x: Tensor, m: Tensor, temperature: Tensor, divide: bool) -> Tensor:
    # x / 1 == x exactly, so skipping the division when every T is 1 changes nothing.
    d = x - m
    return d.div_(temperature) if divide else d


def total_mass(x: Tensor, m: Tensor, temperature: Tensor, divide: bool) -> Tensor:
    """float64 [b, 1]: the sum of exp(d) over the vocabulary.

    Summed in a fixed order per row (the strided groups of ``vocab_groups``, then a sequential
    scan), because a plain row sum is split across threads differently for one
    row than for many, which would make the total depend on the batch.
    """
    w = _scaled(x, m, temperature, divide).exp_()
    batch, vocab = w.shape
    n = vocab // GROUP
    parts = [w[:, n * GROUP :]]
    if n:
        parts.insert(0, w[:, : n * GROUP].view(batch, GROUP, n).sum(dim=1))
    return torch.cat(parts, dim=1).to(torch.float64).cumsum(dim=1)[:, -1:]


def _draw_kept(
    x: Tensor,
    m: Tensor,
    rows: _Rows,
    mass: Tensor | None,
    level: tuple[Tensor, Tensor] | tuple[None, None],
    cut: bool,
    divide: bool,
) -> tuple[Tensor, Tensor]:
    """(tokens [b], covered [b]) for one candidate ``level``: ids [b, C] that hold every
    id whose logit is above bound [b, 1], or (None, None) for the whole vocabulary.

    ``covered`` is False where the level cannot be shown to hold every token the row
    keeps; such rows must be drawn again from a larger level.
    """
    ids, bound = level
    vocab = x.shape[1]
    xc = x if ids is None else x.gather(1, ids)
    d = _scaled(xc, m, rows.temperature, divide)
    covered = torch.ones(d.shape[0], dtype=torch.bool, device=x.device)
    thresh = torch.full_like(m, float("-inf"))
    if cut:
        bound_d = None if bound is None else _scaled(bound, m, rows.temperature, divide)
        sorted_d = _descending_prefix(d, bound_d)
        size = sorted_d.shape[1]
        cum = torch.cumsum(sorted_d.exp(), dim=1, dtype=torch.float64)
        k_on = rows.top_k > 0
        k = torch.where(k_on, rows.top_k.clamp(max=vocab), vocab)
        # The top-k mass is known when the k largest ids are in the prefix. A candidate
        # prefix ends at the bound, itself a candidate (a group's maximum, or the
        # smallest of a topk), so its k-th value there is the row's k-th value.
        k_known = k <= size
        mass_k = cum.gather(1, k.clamp(max=size) - 1)
        if mass is not None:
            mass_k = torch.where(k_on, mass_k, mass)
        # Exclusive cumsum: a token is in the nucleus while the mass before it < top_p.
        before = torch.nn.functional.pad(cum[:, :-1], (1, 0))
        n_p = (before < rows.top_p * mass_k).sum(dim=1, keepdim=True)
        n_p = torch.where(rows.top_p >= 1.0, vocab, n_p)
        n = torch.minimum(k, n_p).clamp(min=1)
        thresh = sorted_d.gather(1, n.clamp(max=size) - 1)
        known = (~k_on | k_known) & (k_known | (n_p < size))
        if bound_d is not None:
            # Every id outside has d <= bound_d: strictly below the cut, none is kept.
            known &= bound_d < thresh
        covered = known.squeeze(1)
    w = d.exp()
    weights = torch.where((d >= thresh) & (w >= rows.min_p), w, 0.0)
    if ids is not None:  # inverse CDF runs in vocabulary order
        ids, order = torch.sort(ids, dim=1)
        weights = weights.gather(1, order)
    pos = inverse_cdf(weights, rows.u)
    tokens = pos if ids is None else ids.gather(1, pos.unsqueeze(1)).squeeze(1)
    return tokens, covered


def _descending_prefix(d: Tensor, bound: Tensor | None) -> Tensor:
    """The largest values of each row of ``d`` in descending order: those above
    ``bound`` and one more (only they can be cut points), or all without a bound."""
    if bound is None:
        return torch.sort(d, dim=1, descending=True).values
    width = int((d > bound).sum(dim=1).max()) + 1
    if width >= d.shape[1]:
        return torch.sort(d, dim=1, descending=True).values
    return torch.topk(d, width, dim=1, sorted=True).values


def _levels(vocab: int, max_k: int) -> Iterator[tuple[str, int]]:
    """Candidate levels, smallest first: ("groups", n), the n top groups (k + 1 groups
    hold the top k ids above their bound); ("top", n), the n largest logits of the row;
    ("all", vocab), the whole vocabulary."""
    num = max(_FIRST_GROUPS, max_k + 1)
    while num * GROUP <= vocab // 32:
        yield "groups", num
        num *= _GROWTH
    width = max(_FIRST_WIDTH, max_k + 1)
    while width <= vocab // 2:
        yield "top", width
        width *= _GROWTH
    yield "all", vocab


def _candidates(groups: VocabGroups, kind: str, num: int) -> tuple[Tensor, Tensor] | tuple[None, None]:
    """(ids, bound): every id whose logit is above bound is in ids; (None, None) = all."""
    if kind == "groups":
        return groups.candidates(num)
    if kind == "top":
        top = torch.topk(groups.x, num, dim=1, sorted=False)
        return top.indices, top.values.amin(dim=1, keepdim=True)  # the rest is <= it
    return None, None


def _greedy(groups: VocabGroups) -> Tensor:
    """First index of each row's maximum, from the top few groups."""
    ids, bound = groups.candidates(_GREEDY_GROUPS)
    if ids is None or bound is None:
        return groups.x.argmax(dim=1)
    vocab = groups.x.shape[1]
    at_max = groups.x.gather(1, ids) == groups.row_max
    first = torch.where(at_max, ids, vocab).amin(dim=1)
    covered = (bound < groups.row_max).squeeze(1)
    if not bool(covered.all()):  # the maximum is tied across groups (or NaN): rare
        first = torch.where(covered, first, groups.x.argmax(dim=1))
    return first


def _filtered(groups: VocabGroups, rows: _Rows, divide: bool) -> Tensor:
    """Rows with top_k or top_p: grow the candidate set until it covers every row."""
    x = groups.x
    k_off = rows.top_k <= 0
    mass = total_mass(x, groups.row_max, rows.temperature, divide) if bool(k_off.any()) else None
    batch = x.shape[0]
    tokens = torch.empty(batch, dtype=torch.int64)
    todo = torch.arange(batch)
    for kind, num in _levels(x.shape[1], int(rows.top_k.max())):
        level = _candidates(groups, kind, num)
        got, covered = _draw_kept(groups.x, groups.row_max, rows, mass, level, cut=True, divide=divide)
        if bool(covered.all()):
            tokens[todo] = got
            return tokens
        tokens[todo[covered]] = got[covered]
        # Only the rows this level did not cover go on to the next.
        left = (~covered).nonzero().squeeze(1)
        todo, rows = todo[left], rows.take(left)
        groups = VocabGroups(groups.x[left], groups.group_max[left], groups.row_max[left])
        mass = None if mass is None else mass[left]
    raise AssertionError("the last level holds the whole vocabulary")


def draw_cpu(x: Tensor, st: SamplingTensors) -> Tensor:
    """Rows split by kind; each kind pays only for what it needs."""
    batch = x.shape[0]
    temps = st.temperature.tolist()
    top_k = st.top_k.tolist()
    top_p = st.top_p.tolist()
    greedy = [i for i in range(batch) if temps[i] == 0]
    filtered = [i for i in range(batch) if temps[i] != 0 and (top_k[i] > 0 or top_p[i] < 1)]
    plain = [i for i in range(batch) if temps[i] != 0 and top_k[i] <= 0 and top_p[i] >= 1]
    tokens = torch.empty(batch, dtype=torch.int64)

    def part(idx: list[int]) -> tuple[Tensor, Tensor]:
        sel = torch.tensor(idx, dtype=torch.int64)
        return sel, (x if len(idx) == batch else x.index_select(0, sel))

    if greedy:
        sel, xs = part(greedy)
        tokens[sel] = _greedy(VocabGroups.of(xs))
    if filtered or plain:
        rows_all = _Rows.of(st, st.temperature)
    if filtered:
        sel, xs = part(filtered)
        divide = any(temps[i] != 1 for i in filtered)
        tokens[sel] = _filtered(VocabGroups.of(xs), rows_all.take(sel), divide)
    if plain:
        sel, xs = part(plain)
        divide = any(temps[i] != 1 for i in plain)
        m = xs.amax(dim=1, keepdim=True)
        got, _ = _draw_kept(xs, m, rows_all.take(sel), None, (None, None), cut=False, divide=divide)
        tokens[sel] = got
    return tokens


def draw_branch_free(x: Tensor, st: SamplingTensors) -> Tensor:
    """The same tokens without host syncs: every row runs every needed stage."""
    greedy_tokens = x.argmax(dim=1)
    if not st.any_sampled:
        return greedy_tokens
    greedy = st.temperature == 0
    rows = _Rows.of(st, torch.where(greedy, 1.0, st.temperature))
    m = x.amax(dim=1, keepdim=True)
    mass = total_mass(x, m, rows.temperature, True) if st.needs_sort else None
    sampled, _ = _draw_kept(x, m, rows, mass, (None, None), cut=st.needs_sort, divide=True)
    return torch.where(greedy, greedy_tokens, sampled)


def draw_tokens(x: Tensor, st: SamplingTensors) -> Tensor:
    """int64 [B]: one token per row of the float32 logits ``x`` [B, V]."""
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if x.device.type == "cpu":
        return draw_cpu(x, st)
    return draw_branch_free(x, st)
