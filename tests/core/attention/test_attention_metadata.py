import pytest
import torch
from mstar.attention import AttentionBatch, AttentionRow
from mstar.kv import KVCacheManager


def make_kv(block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(1, 1, 4, block_size=block_size, num_blocks=16)


def test_build_flat_ragged_metadata() -> None:
    kv = make_kv(block_size=4)
    assert kv.append("a", "main", 6)  # blocks [0, 1]
    assert kv.append("b", "main", 3)  # block [2]
    # this step's tokens
    assert kv.append("a", "main", 1)
    assert kv.append("b", "main", 2)  # block [3]
    assert kv.append("c", "main", 1)  # block [4]
    batch = AttentionBatch.build([("a", "main", 1), ("b", "main", 2), ("c", "main", 1)], kv, "cpu")
    assert batch.num_rows == 3 and batch.num_tokens == 4
    assert batch.max_query_len == 2 and batch.max_kv_len == 7
    assert batch.qo_indptr.tolist() == [0, 1, 3, 4]
    assert batch.kv_lens.tolist() == [7, 5, 1]
    assert batch.block_tables.tolist() == [[0, 1], [2, 3], [4, 0]]
    assert batch.positions.tolist() == [6, 3, 4, 0]
    assert batch.slot_mapping.tolist() == [1 * 4 + 2, 2 * 4 + 3, 3 * 4 + 0, 4 * 4 + 0]
    assert batch.qo_indptr.dtype == torch.int32 and batch.block_tables.dtype == torch.int32
    assert batch.slot_mapping.dtype == torch.int64 and batch.positions.dtype == torch.int64
    assert batch.causal.tolist() == [True, True, True]
    assert not batch.is_decode_only and not batch.has_custom_masks


def test_rows_accept_plain_tuples() -> None:
    kv = make_kv()
    assert kv.append("a", "main", 3)
    mask = torch.ones(3, 3, dtype=torch.bool)
    batch = AttentionBatch.build([("a", "main", 3, False, mask)], kv)
    assert batch.rows[0] == AttentionRow("a", "main", 3, False, mask)
    assert batch.has_custom_masks and batch.causal.tolist() == [False]


def test_build_rejects_inconsistent_rows() -> None:
    kv = make_kv()
    assert kv.append("a", "main", 3)
    with pytest.raises(ValueError, match="at least one row"):
        AttentionBatch.build([], kv)
    with pytest.raises(ValueError, match="append the step's tokens"):
        AttentionBatch.build([("a", "main", 4)], kv)
    with pytest.raises(ValueError, match="query_len must be >= 1"):
        AttentionBatch.build([("a", "main", 0)], kv)
    with pytest.raises(ValueError, match="more than one row"):
        AttentionBatch.build([("a", "main", 1), ("a", "main", 1)], kv)
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        AttentionBatch.build([("a", "main", 2, True, torch.ones(2, 2, dtype=torch.bool))], kv)
    empty_row = torch.ones(2, 3, dtype=torch.bool)
    empty_row[1] = False
    with pytest.raises(ValueError, match="attends to nothing"):
        AttentionBatch.build([("a", "main", 2, True, empty_row)], kv)
