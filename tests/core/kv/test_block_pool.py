import pytest
from mstar.kv import BlockPool


def test_allocate_and_free_round_trip() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(3)
    assert ids is not None and len(set(ids)) == 3
    assert (pool.num_free, pool.num_used, pool.num_blocks) == (1, 3, 4)
    pool.free(ids)
    assert (pool.num_free, pool.num_used) == (4, 0)


def test_allocation_is_all_or_nothing() -> None:
    pool = BlockPool(3)
    assert pool.allocate(2) is not None
    assert pool.allocate(2) is None
    assert pool.num_free == 1
    assert pool.allocate(0) == []


def test_every_block_is_handed_out_once() -> None:
    pool = BlockPool(5)
    a, b = pool.allocate(2), pool.allocate(3)
    assert a is not None and b is not None
    assert sorted(a + b) == list(range(5))


def test_double_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(2)
    assert ids is not None
    pool.free(ids[:1])
    with pytest.raises(ValueError, match="twice"):
        pool.free(ids)  # ids[0] already free: ids[1] must stay used
    assert pool.num_used == 1
    with pytest.raises(ValueError, match="twice"):
        pool.free([ids[1], ids[1]])
    assert pool.num_used == 1


def test_unknown_id_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="not in this pool"):
        pool.free([7])
    with pytest.raises(ValueError):
        pool.allocate(-1)
    with pytest.raises(ValueError):
        BlockPool(0)
