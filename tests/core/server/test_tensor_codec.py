from __future__ import annotations

import pytest
import torch
from mstar.server.messages import TensorMsg
from mstar.server.tensor_codec import SHM_DIR, TensorCodec, cleanup_segments


@pytest.fixture
def prefix(request) -> str:
    name = f"mstar_test{abs(hash(request.node.name)) % 10**8}_"
    yield name
    cleanup_segments(name)


@pytest.mark.parametrize(
    "t",
    [
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.randn(4, 5).t(),  # non-contiguous
        torch.randn(3, dtype=torch.bfloat16),
        torch.tensor(7),
        torch.empty(0, 3),
        torch.tensor([True, False]),
    ],
)
def test_inline_roundtrip(prefix, t):
    codec = TensorCodec(prefix, threshold=1 << 20)
    msg = codec.encode(t)
    assert msg.shm is None
    out = codec.decode(msg)
    assert out.dtype == t.dtype and out.shape == t.shape and torch.equal(out, t)


def test_large_tensor_goes_through_shared_memory_and_is_unlinked(prefix):
    codec = TensorCodec(prefix, threshold=1024)
    t = torch.randn(64, 64)
    msg = codec.encode(t)
    assert msg.shm is not None and msg.shm.startswith(prefix) and msg.data == b""
    assert (SHM_DIR / msg.shm).exists()
    assert torch.equal(codec.decode(msg), t)
    assert not (SHM_DIR / msg.shm).exists()


def test_cleanup_removes_leftovers(prefix):
    codec = TensorCodec(prefix, threshold=0)
    names = [codec.encode(torch.ones(10)).shm for _ in range(3)]
    assert all((SHM_DIR / n).exists() for n in names)
    assert cleanup_segments(prefix) == 3
    assert not any((SHM_DIR / n).exists() for n in names)


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="unsupported dtype"):
        TensorCodec.decode(TensorMsg("complex32", [1], b"\0\0\0\0"))
