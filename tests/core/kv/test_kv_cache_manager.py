import pytest
import torch
from mstar.kv import KVCacheManager


def make(num_blocks: int = 8, block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(
        num_layers=2,
        num_kv_heads=2,
        head_dim=8,
        block_size=block_size,
        num_blocks=num_blocks,
        dtype=torch.float32,
        device="cpu",
    )


def test_cache_tensors_use_nhd_paged_layout() -> None:
    kv = make(num_blocks=3, block_size=5)
    for layer in range(2):
        assert kv.k_cache(layer).shape == (3, 5, 2, 8)
        assert kv.v_cache(layer).shape == (3, 5, 2, 8)
        assert kv.k_cache(layer).data_ptr() != kv.v_cache(layer).data_ptr()
    assert kv.k_cache(0).data_ptr() != kv.k_cache(1).data_ptr()


def test_append_reserves_ceil_blocks_and_counts_tokens() -> None:
    kv = make(block_size=4)
    assert kv.num_tokens("r", "main") == 0 and kv.block_table("r", "main") == []
    assert kv.append("r", "main", 5)
    assert kv.num_tokens("r", "main") == 5 and len(kv.block_table("r", "main")) == 2
    assert kv.append("r", "main", 3)  # fills the second block exactly
    assert len(kv.block_table("r", "main")) == 2
    assert kv.append("r", "main", 1)
    assert kv.num_tokens("r", "main") == 9 and len(kv.block_table("r", "main")) == 3
    assert kv.num_used_blocks == 3 and kv.num_free_blocks == 5
    assert kv.usage == pytest.approx(3 / 8)


def test_exhaustion_returns_false_and_leaves_state_unchanged() -> None:
    kv = make(num_blocks=3, block_size=4)
    assert kv.append("a", "main", 8)
    table = kv.block_table("a", "main")
    assert not kv.append("a", "main", 5)  # needs 2 more blocks, 1 free
    assert kv.block_table("a", "main") == table and kv.num_tokens("a", "main") == 8
    assert not kv.append("b", "main", 5)
    assert "b" not in kv.requests() and kv.streams("b") == []
    assert kv.num_free_blocks == 1
    assert kv.append("b", "main", 4)  # exactly one block still fits


def test_several_streams_per_request_and_free_request_returns_all() -> None:
    kv = make(num_blocks=8, block_size=4)
    assert kv.append("r", "main", 6)
    assert kv.append("r", "uncond", 3)
    assert kv.append("s", "main", 4)
    assert sorted(kv.streams("r")) == ["main", "uncond"]
    tables = (
        kv.block_table("r", "main") + kv.block_table("r", "uncond") + kv.block_table("s", "main")
    )
    assert len(set(tables)) == len(tables) == 4
    kv.free_stream("r", "uncond")
    assert kv.streams("r") == ["main"] and kv.num_used_blocks == 3
    kv.free_request("r")
    kv.free_request("r")  # idempotent
    kv.free_stream("r", "main")  # unknown stream: no-op
    assert kv.requests() == ["s"] and kv.num_used_blocks == 1
    kv.free_request("s")
    assert kv.num_free_blocks == kv.num_blocks and kv.requests() == []


def test_freed_blocks_are_reusable() -> None:
    kv = make(num_blocks=2, block_size=4)
    assert kv.append("a", "main", 8)
    assert not kv.append("b", "main", 1)
    kv.free_request("a")
    assert kv.append("b", "main", 8)


def test_from_memory_budget_sizes_the_pool() -> None:
    per_block = KVCacheManager.bytes_per_block(2, 2, 8, 4, torch.float16)
    assert per_block == 2 * 2 * 4 * 2 * 8 * 2
    kv = KVCacheManager.from_memory_budget(
        per_block * 5 + per_block - 1,
        num_layers=2,
        num_kv_heads=2,
        head_dim=8,
        block_size=4,
        dtype=torch.float16,
        device="cpu",
    )
    assert kv.num_blocks == 5 and kv.k_cache(0).dtype == torch.float16
    with pytest.raises(ValueError, match=rf"{per_block - 1} bytes.*{per_block} bytes"):
        KVCacheManager.from_memory_budget(
            per_block - 1,
            num_layers=2,
            num_kv_heads=2,
            head_dim=8,
            block_size=4,
            dtype=torch.float16,
            device="cpu",
        )


def test_negative_append_is_rejected() -> None:
    with pytest.raises(ValueError):
        make().append("r", "main", -1)
