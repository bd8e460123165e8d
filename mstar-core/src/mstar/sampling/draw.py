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
few dozen gathered logits; rows with top_k, top_p or min_p order only a candidate set
(the top groups of ``vocab_groups``, then a ``topk`` of the row) that grows until it
provably holds everything they keep, and draw over the kept tokens alone. top_p without
top_k needs the vocabulary's mass: bounds from the group maxima settle the cut for most
rows, and only the others pay one more pass to sum it. Over a vocabulary too small for any
candidate level (a few thousand ids, e.g. a TTS codebook), rows with top_k alone find
their cut with one ``topk`` of the row instead of a full sort. Rows without any filter draw
over the whole vocabulary. Elsewhere (CUDA) the draw is branch-free and sync-free so it can
be captured in a graph: argmax for every row, and the same math over the whole
vocabulary (a full sort only when a row uses top_k/top_p).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from mstar.sampling.counter_rng import uniform, uniform_of_keys
from mstar.sampling.host_plan import RowGroup, host_plan
from mstar.sampling.tensors import SamplingTensors
from mstar.sampling.vocab_groups import GROUP, TopGroups, VocabGroups

_GREEDY_GROUPS = 4  # the maximum is in the top group unless it is tied across groups
_FIRST_GROUPS = 32  # a first candidate set of ~500 tokens holds a peaked nucleus
_FIRST_WIDTH = 4096  # then ordered prefixes of the whole row, before a full sort
_GROWTH = 4
_SUM_SLACK = 4e-6  # relative: float32 sums of GROUP weights, float32 exp's monotonicity
_FLOAT32_SUM_SLACK = 1e-3  # relative: a float32 sum of ~1e4 non-negative terms
_EXP_SLACK = 1e-5  # relative: float32 exp against float64 exp


def ceil_to_float32(x: Tensor) -> Tensor:
    """Smallest float32 >= x (float64), so `w32 >= result` equals `w32 >= x` exactly."""
    x32 = x.to(torch.float32)
    up = torch.nextafter(x32, torch.full_like(x32, float("inf")))
    return torch.where(x32.to(torch.float64) < x, up, x32)


def inverse_cdf(weights: Tensor, u: Tensor, host: bool = False) -> Tensor:
    """int64 [B]: the first index whose cumulative weight exceeds u*total.

    float64 cumsum because float32 only resolves ~1e-7 near 1.0, which would
    distort the tail of a 150k-token vocabulary. The chosen index is guaranteed
    to have positive weight: float rounding could otherwise land on a
    zero-weight index (u*total rounding up to total, or a parallel scan that is
    not exactly flat across zeros); those rows fall back to the last positive one.
    With ``host`` (host reads are free) that fallback is computed only when needed.
    """
    vocab = weights.shape[1]
    cdf = torch.cumsum(weights, dim=1, dtype=torch.float64)
    target = u.unsqueeze(1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True)
    # On the CPU a row's cumsum is sequential, so a zero weight leaves it exactly flat:
    # the first index whose cdf exceeds target (>= 0) then has a positive weight, and only
    # a row whose target reaches its total (no such index) needs the fallback.
    if host and int(idx.max()) < vocab:
        return idx.squeeze(1)
    idx = idx.clamp_(max=vocab - 1).squeeze(1)
    ok = weights.gather(1, idx.unsqueeze(1)).squeeze(1) > 0
    last_positive = (vocab - 1) - (weights > 0).flip(1).to(torch.uint8).argmax(dim=1)
    return torch.where(ok, idx, last_positive)


@dataclass(frozen=True)
class _Rows:
    """Parameters of the sampled rows, as columns ([b, 1]) ready to broadcast."""

    temperature: Tensor  # float32
    top_k: Tensor  # int64, <= 0 = off
    top_p: Tensor  # float64
    min_p: Tensor  # float32, ceil of the float64 value
    u: Tensor  # float64 [b]

    @classmethod
    def of(cls, st: SamplingTensors, temperature: Tensor, u: Tensor | None = None) -> _Rows:
        """``u``: the rows' ``uniform(seed, step)`` when the caller has it already."""
        return cls(
            temperature.unsqueeze(1),
            st.top_k.unsqueeze(1),
            st.top_p.unsqueeze(1),
            ceil_to_float32(st.min_p.unsqueeze(1)),
            uniform(st.seed, st.step) if u is None else u,
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


@dataclass(frozen=True)
class _Mass:
    """The mass top_p is relative to, for rows without top_k: float64 [b, 1] bounds on
    the value ``total_mass`` computes (``lo is hi`` when it was computed)."""

    lo: Tensor
    hi: Tensor

    @classmethod
    def exact(cls, mass: Tensor) -> _Mass:
        return cls(mass, mass)

    def take(self, rows: Tensor) -> _Mass:
        lo = self.lo.index_select(0, rows)
        return _Mass(lo, lo if self.hi is self.lo else self.hi.index_select(0, rows))


def _cut(sorted_d: Tensor, bound_d: Tensor | None, rows: _Rows, mass: _Mass | None, vocab: int) -> tuple[Tensor, Tensor]:
    """(thresh [b, 1], known [b]): the top_k/top_p threshold on ``d``, from the row's
    largest scaled logits ``sorted_d`` (descending: every value above ``bound_d`` and one
    more, or the whole row without a bound), and whether that prefix proves it.

    Rows without top_k and top_p (min_p alone) get the prefix's last value: every token
    they keep is above ``bound_d`` when ``known``, so that keeps them all.
    """
    size = sorted_d.shape[1]
    cum = torch.cumsum(sorted_d.exp(), dim=1, dtype=torch.float64)
    k_on = rows.top_k > 0
    k = torch.where(k_on, rows.top_k.clamp(max=vocab), vocab)
    # The top-k mass is known when the k largest ids are in the prefix. A candidate
    # prefix ends at the bound, itself a candidate (a group's maximum, or the
    # smallest of a topk), so its k-th value there is the row's k-th value.
    k_known = k <= size
    mass_k = cum.gather(1, k.clamp(max=size) - 1)
    lo = hi = mass_k
    if mass is not None:
        lo = torch.where(k_on, mass_k, mass.lo)
        hi = lo if mass.hi is mass.lo else torch.where(k_on, mass_k, mass.hi)
    # Exclusive cumsum: a token is in the nucleus while the mass before it < top_p.
    before = torch.nn.functional.pad(cum[:, :-1], (1, 0))
    n_p = (before < rows.top_p * hi).sum(dim=1, keepdim=True)
    p_on = rows.top_p < 1.0
    # With bounds on the mass, the count is known where both ends give the same one.
    p_known = p_on if hi is lo else (before < rows.top_p * lo).sum(dim=1, keepdim=True) == n_p
    n_p = torch.where(p_on, n_p, vocab)
    n = torch.minimum(k, n_p).clamp(min=1)
    thresh = sorted_d.gather(1, n.clamp(max=size) - 1)
    known = (~k_on | k_known) & (k_known | (n_p < size)) & (p_known | ~p_on)
    if bound_d is not None:
        # Every id outside has d <= bound_d: strictly below the cut, none is kept.
        known &= bound_d < thresh
        # min_p alone: every id outside has w <= exp(bound_d) < min_p (with room for
        # float32 exp's rounding), so none is kept.
        outside_w = bound_d.to(torch.float64).exp() * (1 + _EXP_SLACK)
        known = torch.where(k_on | p_on, known, outside_w < rows.min_p)
    return thresh, known.squeeze(1)


def _draw_full(
    x: Tensor, m: Tensor, rows: _Rows, mass: _Mass | None, cut: bool, divide: bool, host: bool = False
) -> Tensor:
    """Tokens [b] drawn over the whole vocabulary (a full sort when ``cut``). ``host``:
    the caller may sync, and without ``cut`` promises that no row uses min_p."""
    d = _scaled(x, m, rows.temperature, divide)
    if host and not cut:
        # Keeping d >= -inf and w >= 0 only drops NaN weights.
        return inverse_cdf(d.exp_().nan_to_num_(nan=0.0), rows.u, host=True)
    thresh = torch.full_like(m, float("-inf"))
    if cut:
        thresh, _ = _cut(torch.sort(d, dim=1, descending=True).values, None, rows, mass, x.shape[1])
    w = d.exp()
    weights = torch.where((d >= thresh) & (w >= rows.min_p), w, 0.0)
    return inverse_cdf(weights, rows.u, host)


def _draw_candidates(
    x: Tensor,
    m: Tensor,
    rows: _Rows,
    mass: _Mass | None,
    level: tuple[Tensor, Tensor],
    divide: bool,
    outside: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(tokens [b], covered [b]) for candidates ids [b, C] that hold every id whose logit
    is above bound [b, 1]. With ``outside`` (the candidates are whole groups), the mass
    is bounded from it instead of ``mass``. ``covered`` is False where the candidates cannot be shown to
    hold every token the row keeps; such rows must be drawn again from a larger level.

    Only the candidates above the bound are ordered, and the draw runs over the kept ones
    alone: the inverse CDF in vocabulary order skips the others' zero weights exactly.
    """
    ids, bound = level
    vocab = x.shape[1]
    d = _scaled(x.gather(1, ids), m, rows.temperature, divide)
    if outside is not None:
        mass = _mass_bounds(d, outside)
    bound_d = _scaled(bound, m, rows.temperature, divide)
    width = min(int((d > bound_d).sum(dim=1).max()) + 1, d.shape[1])
    top = torch.topk(d, width, dim=1, sorted=True)
    thresh, covered = _cut(top.values, bound_d, rows, mass, vocab)
    w = top.values.exp()
    kept = (top.values >= thresh) & (w >= rows.min_p)
    # Dropped ids sort after every real one; their zero weights end the CDF.
    kept_ids, order = torch.sort(torch.where(kept, ids.gather(1, top.indices), vocab), dim=1)
    weights = torch.where(kept, w, 0.0).gather(1, order)
    pos = inverse_cdf(weights, rows.u, host=True)
    return kept_ids.gather(1, pos.unsqueeze(1)).squeeze(1), covered


def _outside_maxima(groups: VocabGroups, top: TopGroups, rows: _Rows, divide: bool) -> Tensor:
    """float64 [b, 1]: the sum of the largest weight of each group outside ``top``,
    summed in float32 (``_mass_bounds`` allows for its rounding)."""
    w = _scaled(groups.group_max, groups.row_max, rows.temperature, divide).exp_()
    return w.scatter_(1, top.indices, 0.0).sum(dim=1, keepdim=True).to(torch.float64)


def _mass_bounds(d: Tensor, outside: Tensor) -> _Mass:
    """Bounds on ``total_mass`` from the candidate groups' scaled logits ``d`` [b, C] and
    ``_outside_maxima``: a group's mass is between its largest weight and GROUP times it.
    ``total_mass`` adds float32 sums of GROUP weights (each within GROUP ulps), hence
    the slack."""
    inside = d.exp().sum(dim=1, keepdim=True, dtype=torch.float64)
    lo = inside + outside * (1 - _FLOAT32_SUM_SLACK)
    hi = inside + GROUP * outside * (1 + _FLOAT32_SUM_SLACK)
    return _Mass(lo * (1 - _SUM_SLACK), hi * (1 + _SUM_SLACK))


def _levels(vocab: int, max_k: int) -> Iterator[tuple[str, int]]:
    """Candidate levels, smallest first: ("groups", n), the n top groups (k + 1 groups
    hold the top k ids above their bound); ("top", n), the n largest logits of the row;
    ("all", vocab), the whole vocabulary."""
    num = max(_FIRST_GROUPS, max_k + 1)
    held = 0  # ids of the last group level
    while num * GROUP <= vocab // 4:
        yield "groups", num
        held = num * GROUP
        num *= _GROWTH
    width = max(_FIRST_WIDTH, max_k + 1)
    while width <= held:  # a topk level no larger than the last group level adds nothing
        width *= _GROWTH
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


# Greedy rows up to this many logits in all take one argmax: below it (e.g. 32 rows of a
# 4,096 vocabulary, or one of 65,536) the grouped search costs more than it saves
# (2-5 us against 58-75 us a call on the 2-core AMD EPYC host at one row, one thread).
ARGMAX_ELEMENTS = 1 << 17


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
    """Rows with top_k, top_p or min_p: grow the candidate set until it covers every row.

    Rows with top_p and no top_k need the vocabulary's mass: on the first level it is
    bounded from the group maxima, and only the rows that level leaves open (bounds too
    loose for their cut, or a nucleus beyond its candidates) sum it in full.
    """
    needs_mass = bool(((rows.top_k <= 0) & (rows.top_p < 1)).any())
    mass: _Mass | None = None
    tokens = torch.empty(groups.x.shape[0], dtype=torch.int64)
    todo = torch.arange(groups.x.shape[0])
    for kind, num in _levels(groups.x.shape[1], int(rows.top_k.max())):
        outside = None
        if kind == "groups" and mass is None and needs_mass:  # bounds for the mass
            top = groups.top_groups(num)
            assert top is not None  # group levels stop well below the number of groups
            level = groups.ids_of(top), top.values.amin(dim=1, keepdim=True)
            outside = _outside_maxima(groups, top, rows, divide)
        else:
            if mass is None and needs_mass:
                mass = _Mass.exact(total_mass(groups.x, groups.row_max, rows.temperature, divide))
            level = _candidates(groups, kind, num)
        if level[0] is None:
            tokens[todo] = _draw_full(groups.x, groups.row_max, rows, mass, cut=True, divide=divide, host=True)
            return tokens
        got, covered = _draw_candidates(groups.x, groups.row_max, rows, mass, level, divide, outside)
        if bool(covered.all()):
            tokens[todo] = got
            return tokens
        tokens[todo[covered]] = got[covered]
        # Only the rows this level did not cover go on to the next.
        left = (~covered).nonzero().squeeze(1)
        todo, rows = todo[left], rows.take(left)
        groups = groups.take(left)
        mass = None if mass is None else mass.take(left)
        needs_mass = bool(((rows.top_k <= 0) & (rows.top_p < 1)).any())
        if outside is not None and needs_mass:  # the rows left sum their mass now
            mass = _Mass.exact(total_mass(groups.x, groups.row_max, rows.temperature, divide))
    raise AssertionError("the last level holds the whole vocabulary")


def whole_row_first(vocab: int, max_k: int) -> bool:
    """Whether the candidate levels start with the whole vocabulary (small vocabularies,
    e.g. a TTS codebook of a few thousand ids): no candidate set is smaller than the row."""
    return next(_levels(vocab, max_k))[0] == "all"


def _draw_top_k(x: Tensor, temperature: Tensor, top_k: Tensor | int, u: Tensor, divide: bool, max_k: int) -> Tensor:
    """Tokens [b] of rows with top_k and no other filter, over a small vocabulary.

    What ``_draw_full`` with its full sort draws for them, without the sort: their cut
    is the k-th largest scaled logit (``_cut`` with top_p off and min_p 0; ``topk``
    returns the row's own values, so it is the same float), every id at or above it is
    kept, ties included, and the inverse CDF runs over the kept weights in vocabulary
    order. ``temperature`` float32 [b, 1], ``top_k`` int64 [b, 1] (> 0) or the one k of
    every row, ``u`` float64 [b]; ``max_k`` is the largest of ``top_k`` (known on the host).
    """
    vocab = x.shape[1]
    d = _scaled(x, x.amax(dim=1, keepdim=True), temperature, divide)
    top = torch.topk(d, min(max_k, vocab), dim=1, sorted=True).values
    if isinstance(top_k, int):  # every row's k-th value is the same column
        thresh = top[:, min(top_k, vocab) - 1 :]
    else:
        thresh = top.gather(1, top_k.clamp(max=vocab) - 1)
    return inverse_cdf(torch.where(d >= thresh, d.exp(), 0.0), u, host=True)


def draw_cpu(x: Tensor, st: SamplingTensors) -> Tensor:
    """Rows split by kind; each kind pays only for what it needs. Host reads are free on
    the CPU: the rows' parameters are read once per batch (``mstar.sampling.host_plan``),
    and their uniforms computed in Python integers (the same bits as ``uniform``)."""
    batch, vocab = x.shape
    plan = host_plan(st.temperature, st.top_k, st.top_p, st.min_p, st.seed, st.host, vocab, whole_row_first)
    u_all: Tensor | None = None
    if plan.sampled:
        u_all = torch.tensor(uniform_of_keys(plan.keys, st.step.tolist()), dtype=torch.float64)
    parts: list[tuple[list[int], Tensor]] = []

    def col(t: Tensor, group: RowGroup) -> Tensor:
        """The group's rows of ``t`` (the logits or a parameter column)."""
        return t if group.sel is None else t.index_select(0, group.sel)

    if plan.greedy is not None:
        xg = col(x, plan.greedy)
        parts.append((plan.greedy.rows, xg.argmax(dim=1) if xg.numel() <= ARGMAX_ELEMENTS else _greedy(VocabGroups.of(xg))))
    if (group := plan.top_k_only) is not None:
        assert u_all is not None
        k = group.same_k if group.same_k is not None else col(st.top_k, group).unsqueeze(1)
        drawn = _draw_top_k(col(x, group), col(st.temperature, group).unsqueeze(1), k, col(u_all, group),
                            group.divide, group.max_k)
        parts.append((group.rows, drawn))
    if plan.filtered is not None or plan.plain is not None:
        rows_all = _Rows.of(st, st.temperature, u_all)
    if (group := plan.filtered) is not None:
        rows = rows_all if group.sel is None else rows_all.take(group.sel)
        parts.append((group.rows, _filtered(VocabGroups.of(col(x, group)), rows, group.divide)))
    if (group := plan.plain) is not None:
        xs = col(x, group)
        rows = rows_all if group.sel is None else rows_all.take(group.sel)
        parts.append((group.rows, _draw_full(xs, xs.amax(dim=1, keepdim=True), rows, None, cut=False,
                                             divide=group.divide, host=True)))
    if len(parts) == 1:
        return parts[0][1]  # one kind of row: its draw is the batch's, in order
    tokens = torch.empty(batch, dtype=torch.int64)
    for idx, drawn in parts:
        tokens[torch.tensor(idx, dtype=torch.int64)] = drawn
    return tokens


def draw_branch_free(x: Tensor, st: SamplingTensors) -> Tensor:
    """The same tokens without host syncs: every row runs every needed stage."""
    greedy_tokens = x.argmax(dim=1)
    if not st.any_sampled:
        return greedy_tokens
    greedy = st.temperature == 0
    rows = _Rows.of(st, torch.where(greedy, 1.0, st.temperature))
    m = x.amax(dim=1, keepdim=True)
    mass = _Mass.exact(total_mass(x, m, rows.temperature, True)) if st.needs_sort else None
    sampled = _draw_full(x, m, rows, mass, cut=st.needs_sort, divide=True)
    return torch.where(greedy, greedy_tokens, sampled)


def draw_tokens(x: Tensor, st: SamplingTensors) -> Tensor:
    """int64 [B]: one token per row of the float32 logits ``x`` [B, V]."""
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if x.device.type == "cpu":
        return draw_cpu(x, st)
    return draw_branch_free(x, st)
