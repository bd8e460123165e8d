"""StreamBuffer: the chunks of every policy equal those of the plain "concatenate all
items, then slice" definition, while reads are views and appends copy only new items."""

from __future__ import annotations

import random

import pytest
import torch
from mstar.engine.stream_buffer import StreamBuffer
from mstar.graph.chunking import FixedChunks, LeftContextChunks, SlidingWindowChunks

POLICIES = [
    FixedChunks(3),
    FixedChunks(1),
    SlidingWindowChunks(window=5, hop=2),
    SlidingWindowChunks(window=4, hop=4),
    LeftContextChunks(chunk=4, left_context=6, first_chunk=2),
    LeftContextChunks(chunk=3),
]


class ConcatReference:
    """The definition: all items so far concatenated, sliced where the policy says."""

    def __init__(self, policy) -> None:
        self.policy, self.items, self.consumed, self.closed = policy, [], 0, False

    def next_chunk(self):
        length = sum(i.shape[0] for i in self.items)
        cut = self.policy.next_chunk(length, self.consumed, self.closed)
        if cut is None:
            return None
        start, end, context = cut
        return torch.cat(self.items)[start:end], context, end


def drain(buf: StreamBuffer, ref: ConcatReference) -> int:
    n = 0
    while True:
        got, want = buf.next_chunk(), ref.next_chunk()
        if want is None:
            assert got is None
            return n
        assert got is not None
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
        buf.consume(got[2])
        ref.consumed = want[2]
        n += 1


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("trailing", [(), (7,)])
def test_chunks_equal_the_concatenation_definition(policy, trailing):
    rng = random.Random(0)
    buf, ref = StreamBuffer(policy), ConcatReference(policy)
    chunks = 0
    for i in range(120):
        n = rng.choice([0, 1, 1, 2, 3, 5])
        value = torch.randn(n, *trailing)
        if not trailing and n == 1 and i % 2:
            value = value[0]  # a 0-d item counts as one
        buf.append(value)
        ref.items.append(value.reshape(-1, *trailing))
        if rng.random() < 0.6:
            chunks += drain(buf, ref)
    buf.closed = ref.closed = True
    chunks += drain(buf, ref)
    assert buf.drained and chunks > 20


def test_reads_are_views_and_appends_reallocate_rarely():
    buf = StreamBuffer(SlidingWindowChunks(window=8, hop=4))
    storages = set()
    held = []
    for step in range(2000):
        buf.append(torch.full((3, 2), float(step)))
        chunk = buf.next_chunk()
        if chunk is not None:
            window = chunk[0]
            # A view of the buffer: reading costs no copy of the stream.
            assert window.untyped_storage().data_ptr() == buf._data.untyped_storage().data_ptr()
            held.append((window, window.clone()))
            buf.consume(chunk[2])
        if buf._data is not None:  # items are stored when a chunk is first cut
            storages.add(buf._data.untyped_storage().data_ptr())
    assert len(storages) <= 12  # capacity doubles: O(log n) reallocations for 6000 items
    # Chunks handed out earlier are unchanged by every later append.
    assert all(torch.equal(view, copy) for view, copy in held)


def test_dtype_promotes_like_cat_and_shape_mismatch_is_an_error():
    buf = StreamBuffer(FixedChunks(4))
    buf.append(torch.tensor([1, 2], dtype=torch.int64))
    buf.append(torch.tensor([0.5, 1.5]))
    window, _, _ = buf.next_chunk()
    assert window.dtype == torch.float32 and window.tolist() == [1.0, 2.0, 0.5, 1.5]
    with pytest.raises(ValueError, match="shape"):
        buf.append(torch.zeros(2, 3))
    empty = StreamBuffer(FixedChunks(2))
    empty.closed = True
    assert empty.next_chunk() is None and empty.drained


def test_a_large_item_reserves_only_itself():
    """A stream of one large item (e.g. a prompt's hidden states) is not allocated 16 times."""
    from mstar.engine.stream_buffer import LARGE_ITEM

    buf = StreamBuffer(FixedChunks(1))
    big = torch.randn(1, 2, LARGE_ITEM // 2 + 1)
    buf.append(big)
    buf.next_chunk()  # stores what was appended
    assert buf._data is not None and buf._data.shape[0] == 1
    buf.append(big)  # it still grows (doubling) and reads back
    window, _, _ = buf.next_chunk()
    assert torch.equal(window, big)
    small = StreamBuffer(FixedChunks(1))
    small.append(torch.zeros(1, 4))
    small.next_chunk()
    assert small._data is not None and small._data.shape[0] == 16
