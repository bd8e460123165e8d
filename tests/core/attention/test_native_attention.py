"""``mstar_native::paged_attention`` (``mstar.attention.native_attention``): on decode steps
served by the decode buffer the C++ op must give ``TorchAttentionBackend.run``'s outputs,
paged cache and buffer bit for bit, and keep the buffer appending from step to step; every
other step must reach the backend's Python ``run``; compiled stacks use it."""

from __future__ import annotations

import pytest
import torch
from mstar.attention import AttentionBatch, TorchAttentionBackend, native_attention
from mstar.attention.compiled_layers import compile_with_attention
from mstar.kv import KVCacheManager
from mstar.native import native_module

NATIVE = native_module()
# Skipped where the extension cannot be built; a failure under MSTAR_REQUIRE_NATIVE=1 (tests/core/conftest.py).
pytestmark = pytest.mark.usefixtures("native_ops")

LAYERS, HKV, DIM = 2, 2, 8
# Steps of (request, new tokens): a prefill, decode steps of two rows of different lengths
# (a mask), a row leaving (the buffer fills again), a third joining with a prefill.
STEPS = [[("a", 5), ("b", 3)], *[[("a", 1), ("b", 1)]] * 4, [("b", 1)], [("b", 1)], [("b", 1), ("c", 6)],
         [("b", 1), ("c", 1)], [("b", 1), ("c", 1)]]


def _pair(dtype: torch.dtype = torch.float32):
    caches = [KVCacheManager(LAYERS, HKV, DIM, block_size=4, num_blocks=512, dtype=dtype) for _ in range(2)]
    return caches, [TorchAttentionBackend(kv) for kv in caches]


def _plan(kv: KVCacheManager, backend: TorchAttentionBackend, rows) -> None:
    for rid, n in rows:
        assert kv.append(rid, "main", n)
    backend.plan(AttentionBatch.build([(rid, "main", n) for rid, n in rows], kv, "cpu"))


def _buffers(backend: TorchAttentionBackend) -> list[torch.Tensor]:
    """Each row's keys and values in the buffer, up to its length (the storage past them is
    uninitialised memory, so it differs between two buffers whatever the op does)."""
    buffer = backend._buffer
    assert buffer is not None
    return [read[b, :, :n] for layer in buffer._views for read, _ in layer for b, n in enumerate(buffer._kv_lens)]


@pytest.mark.parametrize("hq", [2, 4])
def test_decode_steps_write_and_attend_as_the_python_backend_does(hq):
    (py_kv, nat_kv), (py_be, nat_be) = _pair()
    gen = torch.Generator().manual_seed(hq)
    calls: list[int] = []

    def fallback(layer, q, k, v):
        calls.append(layer)
        return nat_be.run(layer, q, k, v)

    native_steps = 0
    for rows in STEPS:
        _plan(py_kv, py_be, rows)
        _plan(nat_kv, nat_be, rows)
        tokens = sum(n for _, n in rows)
        decode = nat_be.native_decode_step() is not None
        native_steps += decode
        NATIVE.bind_attention(fallback, nat_be.native_decode_step())
        try:
            for layer in range(LAYERS):
                q, k, v = (torch.randn(tokens, h, DIM, generator=gen) for h in (hq, HKV, HKV))
                want = py_be.run(layer, q, k, v)
                got = torch.ops.mstar_native.paged_attention(q, k, v, layer)
                assert torch.equal(got, want), (rows, layer)
        finally:
            native_attention.unbind(NATIVE, nat_be)
        assert calls == ([] if decode else list(range(LAYERS))), rows
        calls.clear()
        for layer in range(LAYERS):
            assert torch.equal(nat_kv.k_cache(layer), py_kv.k_cache(layer))
            assert torch.equal(nat_kv.v_cache(layer), py_kv.v_cache(layer))
        for got, want in zip(_buffers(nat_be), _buffers(py_be), strict=True):
            assert torch.equal(got, want)
        # Both buffers agree on whether the next step can append.
        assert nat_be._buffer._written == py_be._buffer._written
    assert native_steps == 8
    # After a native step the next decode step appended (no fill) in both.
    assert nat_be._plan.buffer is not None and not nat_be._plan.buffer.fill


def test_activations_in_another_dtype_than_the_cache_take_the_python_run():
    (py_kv, nat_kv), (py_be, nat_be) = _pair(torch.bfloat16)
    calls: list[int] = []

    def fallback(layer, q, k, v):
        calls.append(layer)
        return nat_be.run(layer, q, k, v)

    gen = torch.Generator().manual_seed(0)
    for rows in STEPS[:3]:
        _plan(py_kv, py_be, rows)
        _plan(nat_kv, nat_be, rows)
        tokens = sum(n for _, n in rows)
        NATIVE.bind_attention(fallback, nat_be.native_decode_step())
        try:
            q, k, v = (torch.randn(tokens, h, DIM, generator=gen) for h in (HKV, HKV, HKV))
            assert torch.equal(torch.ops.mstar_native.paged_attention(q, k, v, 0), py_be.run(0, q, k, v))
        finally:
            native_attention.unbind(NATIVE, nat_be)
    assert calls == [0, 0, 0]


def test_a_malformed_call_says_what_is_wrong():
    (kv, _), (backend, _) = _pair()
    for rows in STEPS[:2]:
        _plan(kv, backend, rows)
    NATIVE.bind_attention(backend.run, backend.native_decode_step())
    try:
        with pytest.raises(ValueError, match=r"k/v must be \[T, Hkv, D\]"):
            torch.ops.mstar_native.paged_attention(torch.randn(2, 2, DIM), torch.randn(3, HKV, DIM),
                                                   torch.randn(3, HKV, DIM), 0)
    finally:
        NATIVE.unbind_attention()
    with pytest.raises(RuntimeError, match="no backend bound"):
        torch.ops.mstar_native.paged_attention(torch.randn(2, 2, DIM), torch.randn(2, HKV, DIM),
                                               torch.randn(2, HKV, DIM), 0)


_gen = torch.Generator().manual_seed(3)
W = [torch.randn(16, 2 * DIM + 2 * HKV * DIM, generator=_gen) / 4 for _ in range(LAYERS)]


def stack(attention, x: torch.Tensor) -> torch.Tensor:
    for layer in range(LAYERS):
        q, k, v = torch.split(torch.tanh(x) @ W[layer], [2 * DIM, HKV * DIM, HKV * DIM], dim=1)
        x = x + attention.run(layer, q.reshape(-1, 2, DIM), k.reshape(-1, HKV, DIM), v.reshape(-1, HKV, DIM)).reshape(-1, 16)
    return x


def test_a_compiled_stack_attends_natively_on_decode_steps(monkeypatch):
    calls: list[int] = []
    real = TorchAttentionBackend.run
    monkeypatch.setattr(TorchAttentionBackend, "run", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    compiled = compile_with_attention(stack, cpp_wrapper=True)
    (kv_e, kv_c), (eager, comp) = _pair()
    gen = torch.Generator().manual_seed(4)
    for rows in STEPS:
        x = torch.randn(sum(n for _, n in rows), 16, generator=gen)
        _plan(kv_e, eager, rows)
        _plan(kv_c, comp, rows)
        want = stack(eager, x)
        calls.clear()
        got = compiled(comp, x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        decode = comp._plan.buffer is not None
        assert len(calls) == (0 if decode else LAYERS), rows
    for layer in range(LAYERS):
        torch.testing.assert_close(kv_c.k_cache(layer), kv_e.k_cache(layer), rtol=1e-5, atol=1e-5)
