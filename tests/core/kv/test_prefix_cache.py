"""The prefix index of the KV cache: sharing by identity, reference counts, LRU eviction of
unreferenced blocks only, and exact free-block accounting."""

from __future__ import annotations

import torch
from mstar.kv import KVCacheManager
from mstar.model.submodule_base import ARNodeInputs, ARNodeSubmodule

BS = 4


def _kv(blocks: int = 8) -> KVCacheManager:
    return KVCacheManager(num_layers=1, num_kv_heads=1, head_dim=2, block_size=BS, num_blocks=blocks, prefix_caching=True)


def _feed(kv: KVCacheManager, rid: str, ids: list, mapped: int = 0) -> None:
    assert kv.append(rid, "main", len(ids) - mapped)
    kv.note_fed(rid, "main", mapped, ids[mapped:])


def test_a_second_request_maps_the_first_ones_full_blocks() -> None:
    kv = _kv()
    prompt = list(range(10))  # two full blocks and two positions
    _feed(kv, "a", prompt)
    assert kv.map_prefix("b", "main", prompt, limit=len(prompt) - 1) == 8
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    assert kv.prefix_cache.references(kv.block_table("a")[0]) == 2
    # The limit keeps at least one position to compute: 8 positions, one block.
    assert kv.map_prefix("c", "main", prompt[:8], limit=7) == 4


def test_same_tokens_with_another_identity_share_nothing() -> None:
    kv = _kv()
    tokens = [5] * 9
    _feed(kv, "image-a", [(t, "sha-of-image-a") for t in tokens])
    assert kv.map_prefix("image-b", "main", [(t, "sha-of-image-b") for t in tokens], limit=8) == 0
    assert kv.map_prefix("image-a2", "main", [(t, "sha-of-image-a") for t in tokens], limit=8) == 8


def test_a_changed_block_breaks_the_chain_after_it() -> None:
    kv = _kv()
    _feed(kv, "a", list(range(12)))
    other = list(range(12))
    other[5] = 99  # the second block differs: only the first can be shared
    assert kv.map_prefix("b", "main", other, limit=11) == 4


def test_released_blocks_stay_cached_and_count_as_free_until_evicted_lru_first() -> None:
    kv = _kv(blocks=4)
    _feed(kv, "a", list(range(8)))  # blocks of a: 2
    _feed(kv, "b", list(range(100, 108)))  # blocks of b: 2
    assert kv.num_free_blocks == 0
    a_blocks, b_blocks = kv.block_table("a"), kv.block_table("b")
    kv.free_request("a")
    kv.free_request("b")
    assert kv.num_free_blocks == 4 and kv.num_used_blocks == 0 and kv.num_cached_blocks == 4
    assert kv.append("c", "main", 8)  # needs 2: evicts a's (released first), keeps b's
    assert sorted(kv.block_table("c")) == sorted(a_blocks)
    assert kv.prefix_cache.evictions == 2
    assert kv.map_prefix("d", "main", list(range(8)), limit=7) == 0  # a's prefix is gone
    assert kv.map_prefix("e", "main", list(range(100, 108)), limit=8) == 8  # b's is not
    assert kv.block_table("e") == b_blocks


def test_a_block_some_request_holds_is_never_evicted() -> None:
    kv = _kv(blocks=3)
    _feed(kv, "a", list(range(8)))
    assert kv.map_prefix("b", "main", list(range(8)), limit=8) == 8
    kv.free_request("a")  # b still holds both blocks
    assert kv.num_free_blocks == 1
    assert not kv.append("c", "main", 8)  # 2 needed, 1 free, none evictable
    assert kv.append("c", "main", 4)
    kv.free_request("b")
    assert kv.num_free_blocks == 2 and kv.num_cached_blocks == 2


def test_positions_without_an_identity_stop_sharing_from_there_on() -> None:
    kv = _kv()
    assert kv.append("a", "main", 12)
    kv.note_fed("a", "main", 0, list(range(4)))
    kv.note_fed("a", "main", 4, None)  # e.g. embedding rows nobody named
    kv.note_fed("a", "main", 8, list(range(8, 12)))
    assert kv.num_cached_blocks == 1
    kv.note_fed("b", "main", 3, [1])  # a stream that does not exist: nothing happens
    assert kv.num_cached_blocks == 1


def test_default_identities_are_token_ids_of_plain_inputs_only() -> None:
    keys = ARNodeSubmodule.prefix_cache_keys
    ids = torch.tensor([3, 1, 4])
    assert keys(None, "w", None, ARNodeInputs(input_ids=ids, input_seq_len=3)) == [3, 1, 4]  # type: ignore[arg-type]
    for other in (
        ARNodeInputs(input_embeds=torch.zeros(3, 2), input_seq_len=3),
        ARNodeInputs(input_ids=ids, custom_pos_ids=torch.zeros(3, 3, dtype=torch.long), input_seq_len=3),
        ARNodeInputs(input_ids=ids, tensor_inputs={"speaker": torch.zeros(2)}, input_seq_len=3),
        ARNodeInputs(input_ids=ids, kwargs={"adapter": "x"}, input_seq_len=3),
    ):
        assert keys(None, "w", None, other) is None  # type: ignore[arg-type]
