"""FlashInfer backend: host-side planning runs everywhere; kernel parity needs CUDA."""

import pytest
import torch
from mstar.attention import AttentionBatch, AttentionRow, TorchAttentionBackend
from mstar.attention.flashinfer_backend import FlashInferAttentionBackend, flashinfer_plan_inputs
from mstar.attention.selection import flashinfer_available
from mstar.kv import KVCacheManager


def test_plan_inputs_are_csr_page_tables() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=16)
    assert kv.append("a", "main", 7)  # blocks [0, 1], 3 in the last
    assert kv.append("b", "main", 4)  # block [2], full
    assert kv.append("c", "main", 9)  # blocks [3, 4, 5], 1 in the last
    rows = [("a", "main", 1), ("b", "main", 4), ("c", "main", 2)]
    inputs = flashinfer_plan_inputs(AttentionBatch.build(rows, kv))
    assert inputs.qo_indptr.tolist() == [0, 1, 5, 7]
    assert inputs.paged_kv_indptr.tolist() == [0, 2, 3, 6]
    assert inputs.paged_kv_indices.tolist() == [0, 1, 2, 3, 4, 5]
    assert inputs.paged_kv_last_page_len.tolist() == [3, 4, 1]
    assert inputs.paged_kv_indices.dtype == torch.int32
    assert inputs.causal and inputs.custom_mask is None


def test_mixed_mask_rules_become_one_flat_custom_mask() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=16)
    assert kv.append("a", "main", 3)
    assert kv.append("b", "main", 2)
    assert kv.append("c", "main", 2)
    custom = torch.tensor([[True, False], [True, True]])
    rows = [
        ("a", "main", 2),
        AttentionRow("b", "main", 2, causal=False),
        ("c", "main", 2, True, custom),
    ]
    inputs = flashinfer_plan_inputs(AttentionBatch.build(rows, kv))
    causal_a = [[True, True, False], [True, True, True]]  # last 2 of 3 tokens
    expected = torch.cat(
        [torch.tensor(causal_a).flatten(), torch.ones(4, dtype=torch.bool), custom.flatten()]
    )
    assert inputs.custom_mask is not None and torch.equal(inputs.custom_mask, expected)

    all_bidirectional = [AttentionRow("a", "main", 3, causal=False)]
    inputs = flashinfer_plan_inputs(AttentionBatch.build(all_bidirectional, kv))
    assert not inputs.causal and inputs.custom_mask is None


def test_needs_a_cuda_cache() -> None:
    kv = KVCacheManager(1, 1, 4, block_size=4, num_blocks=2, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA"):
        FlashInferAttentionBackend(kv)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or not flashinfer_available(), reason="needs CUDA + flashinfer"
)
@pytest.mark.parametrize("block_size", [16, 5])
def test_matches_torch_backend_on_cuda(block_size: int) -> None:
    torch.manual_seed(0)
    dtype, hq, hkv, d = torch.bfloat16, 8, 2, 128
    caches = [
        KVCacheManager(1, hkv, d, block_size, num_blocks=64, dtype=dtype, device="cuda")
        for _ in range(2)
    ]
    backends = [FlashInferAttentionBackend(caches[0]), TorchAttentionBackend(caches[1])]
    prefix = torch.ones(9, 9, dtype=torch.bool).tril()
    prefix[:4, :4] = True
    steps = [
        [("a", "main", 9, True, prefix), ("b", "main", 30)],
        [("a", "main", 1), ("c", "main", 17), ("b", "main", 1)],
        [("a", "main", 1), ("b", "main", 1), ("c", "main", 1)],
    ]
    for rows in steps:
        outs = []
        t = sum(r[2] for r in rows)
        q, k, v = (torch.randn(t, h, d, dtype=dtype, device="cuda") for h in (hq, hkv, hkv))
        for kv, attn in zip(caches, backends, strict=True):
            for r in rows:
                assert kv.append(r[0], r[1], r[2])
            attn.plan(AttentionBatch.build(rows, kv))
            outs.append(attn.run(0, q, k, v))
        torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)
