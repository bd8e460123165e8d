"""The token embedding split by vocabulary rows (mstar.parallel.shard), both ranks simulated
in one process: a stand-in group whose collectives return the rank's own tensor, so each
rank's part can be compared with the whole table. The two-process runs over gloo are in
test_tensor_parallel.py."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from mstar.parallel.shard import VocabParallelEmbedding, shard_module
from torch import nn


@dataclass
class OwnPart:
    """A stand-in group: the sum and gather of one rank's part are that part."""

    rank: int
    size: int = 2
    expert_parallel: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(8, 4)
        self.codebook = nn.Embedding(6, 4)  # not the token embedding: stays whole


class TinyLM(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(4, 8, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight


def _ranks(tied: bool) -> tuple[TinyLM, list[TinyLM]]:
    torch.manual_seed(0)
    whole = TinyLM(tied).requires_grad_(False)
    ranks = []
    for rank in range(2):
        part = copy.deepcopy(whole)
        counts = shard_module(part, OwnPart(rank))  # type: ignore[arg-type]
        assert counts["embedding"] == 1 and counts["lm_head"] == 1
        ranks.append(part)
    return whole, ranks


def test_the_ranks_lookups_sum_to_the_whole_table() -> None:
    whole, ranks = _ranks(tied=False)
    ids = torch.tensor([[0, 3, 4, 7], [5, 5, 1, 2]])
    parts = [r.model.embed_tokens(ids) for r in ranks]
    for rank, (r, part) in enumerate(zip(ranks, parts, strict=True)):
        table = r.model.embed_tokens
        assert isinstance(table, VocabParallelEmbedding)
        assert torch.equal(table.weight, whole.model.embed_tokens.weight[4 * rank : 4 * rank + 4])
        mine = (ids >= 4 * rank) & (ids < 4 * rank + 4)
        assert torch.equal(part[~mine], torch.zeros_like(part[~mine]))  # others' ids: zeros
        assert type(r.model.codebook) is nn.Embedding and torch.equal(r.model.codebook.weight, whole.model.codebook.weight)
    assert torch.equal(parts[0] + parts[1], whole.model.embed_tokens(ids))


def test_a_tied_head_shares_its_ranks_rows_with_the_embedding() -> None:
    whole, ranks = _ranks(tied=True)
    h = torch.randn(3, 4)
    for r in ranks:
        assert r.lm_head.weight is r.model.embed_tokens.weight  # held once on the rank
        assert r.lm_head.weight.shape == (4, 4)
    logits = torch.cat([r.lm_head(h) for r in ranks], dim=-1)
    torch.testing.assert_close(logits, whole.lm_head(h), rtol=0, atol=1e-6)


def test_an_untied_head_keeps_its_own_rows() -> None:
    whole, ranks = _ranks(tied=False)
    for rank, r in enumerate(ranks):
        assert r.lm_head.weight is not r.model.embed_tokens.weight
        assert torch.equal(r.lm_head.weight, whole.lm_head.weight[4 * rank : 4 * rank + 4])
