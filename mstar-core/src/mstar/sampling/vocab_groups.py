"""Candidate sets for the largest logits of a row without sorting the whole vocabulary.

The first ``GROUP * (V // GROUP)`` ids are split into ``V // GROUP`` strided groups
(group j holds ids ``j, j + n, j + 2n, ...`` with ``n = V // GROUP``), so every group's
maximum comes from one vertical reduction over a ``[B, GROUP, n]`` view: a single
vectorised pass over the logits. The ``V % GROUP`` leftover ids (the tail) are always
candidates. Taking the ``L`` groups with the largest maxima gives a candidate set that
holds every id whose logit is above ``bound``, the L-th largest group maximum: an id
outside it sits in a group whose maximum is at most ``bound``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

GROUP = 16


class TopGroups(NamedTuple):
    values: Tensor  # [B, L] the groups' maxima
    indices: Tensor  # int64 [B, L] group indices


@dataclass(frozen=True)
class VocabGroups:
    """Group maxima of the rows of ``x`` [B, V] (float32)."""

    x: Tensor
    group_max: Tensor  # [B, n] maximum of each strided group
    row_max: Tensor  # [B, 1] maximum of the row
    super_max: Tensor  # [B, n // GROUP] maximum of each strided super-group (of groups)

    @classmethod
    def of(cls, x: Tensor) -> VocabGroups:
        batch, vocab = x.shape
        n = vocab // GROUP
        if n == 0:
            return cls(x, x.new_empty(batch, 0), x.amax(dim=1, keepdim=True), x.new_empty(batch, 0))
        group_max = x[:, : n * GROUP].view(batch, GROUP, n).amax(dim=1)
        # The row maximum from the super-groups: the pass over the group maxima that
        # finds it also gives what ``top_groups`` selects from.
        ns = n // GROUP
        super_max = group_max[:, : ns * GROUP].view(batch, GROUP, ns).amax(dim=1)
        row_max = torch.cat([super_max, group_max[:, ns * GROUP :], x[:, n * GROUP :]], dim=1)
        return cls(x, group_max, row_max.amax(dim=1, keepdim=True), super_max)

    def take(self, rows: Tensor) -> VocabGroups:
        """The groups of some rows only."""
        return VocabGroups(*(t.index_select(0, rows) for t in (self.x, self.group_max, self.row_max, self.super_max)))

    @property
    def num_groups(self) -> int:
        return self.group_max.shape[1]

    def candidates(self, num: int) -> tuple[Tensor, Tensor] | tuple[None, None]:
        """(ids [B, C], bound [B, 1]) for the ``num`` groups with the largest maxima.

        Every id whose logit is > bound is in ``ids``. (None, None) when that would be
        every group: the candidates are then the whole vocabulary.
        """
        top = self.top_groups(num)
        if top is None:
            return None, None
        return self.ids_of(top), top.values.amin(dim=1, keepdim=True)

    def top_groups(self, num: int) -> TopGroups | None:
        """The ``num`` groups with the largest maxima (values, group indices), unordered;
        None when that would be every group.

        Selected in two steps, as groups of ids are: the groups are split into strided
        super-groups of GROUP groups, and the ``num`` best groups are picked among the
        members of the ``num`` best super-groups (and the leftover groups). Each of those
        super-groups holds a group at its maximum, so a group outside them is never
        above the ``num``-th pick: the same groups a ``topk`` over all of them takes, for
        a ``topk`` over ~2 * GROUP * num maxima instead of V / GROUP.
        """
        batch, n = self.group_max.shape
        if num >= n:
            return None
        ns = n // GROUP
        if num * GROUP * 2 >= n:
            top = torch.topk(self.group_max, num, dim=1, sorted=False)
            return TopGroups(top.values, top.indices)
        best = torch.topk(self.super_max, num, dim=1, sorted=False).indices
        offsets = torch.arange(GROUP, device=self.x.device).mul_(ns).view(1, GROUP, 1)
        members = (best.unsqueeze(1) + offsets).reshape(batch, GROUP * num)
        if n > ns * GROUP:
            leftover = torch.arange(ns * GROUP, n, device=self.x.device).expand(batch, -1)
            members = torch.cat([members, leftover], dim=1)
        top = torch.topk(self.group_max.gather(1, members), num, dim=1, sorted=False)
        return TopGroups(top.values, members.gather(1, top.indices))

    def ids_of(self, top: TopGroups) -> Tensor:
        """int64 [B, C]: the ids of the groups ``top`` names, then the tail ids."""
        batch, vocab = self.x.shape
        n = self.num_groups
        num = top.indices.shape[1]
        offsets = torch.arange(GROUP, device=self.x.device).mul_(n).view(1, GROUP, 1)
        ids = (top.indices.unsqueeze(1) + offsets).reshape(batch, GROUP * num)
        if vocab > n * GROUP:
            tail = torch.arange(n * GROUP, vocab, device=self.x.device).expand(batch, -1)
            ids = torch.cat([ids, tail], dim=1)
        return ids
