"""Counter-based randomness: a uniform draw that is a pure function of (seed, step).

No torch.Generator and no global RNG state: a row's draw cannot depend on its
batch position, the batch size or other requests, and the computation is a few
elementwise int64 ops, so it is safe inside CUDA graphs and needs no host sync.

The hash is SplitMix64 (Steele, Lea & Flood 2014). torch has no uint64 arithmetic,
so we work in int64: addition and multiplication wrap modulo 2**64 exactly like
unsigned arithmetic, and logical right shifts are emulated by masking off the
sign bits that torch's arithmetic ``>>`` copies in.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

_Bits = TypeVar("_Bits", Tensor, int)


def _as_int64(v: int) -> int:
    """Reinterpret an unsigned 64-bit constant as the int64 with the same bits."""
    return v - (1 << 64) if v >= (1 << 63) else v


GOLDEN_GAMMA = _as_int64(0x9E3779B97F4A7C15)
_MIX1 = _as_int64(0xBF58476D1CE4E5B9)
_MIX2 = _as_int64(0x94D049BB133111EB)
# What a logical right shift by 30, 27 and 31 keeps (torch's ``>>`` on int64 copies the sign).
_LOW34, _LOW37, _LOW33 = (1 << 34) - 1, (1 << 37) - 1, (1 << 33) - 1
_MASK64 = (1 << 64) - 1


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits by ``k`` (0 < k < 64)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(z: _Bits) -> _Bits:
    """SplitMix64 finaliser: a bijective avalanche of the 64 bits of ``z``.

    ``z`` is an int64 tensor (elementwise; its products wrap as unsigned ones would) or a
    Python int in [0, 2**64), whose products are reduced mod 2**64 (the signed constants
    give the same residues as the unsigned ones). This is the only Python SplitMix64;
    ``mstar/native/draws.cpp`` has the C++ one, and ``tests/core/sampling/test_native_draw.py``
    checks that the two agree. The shifts are written out (``_shr``'s masks) rather than
    called: ``uniform_of_keys`` runs this per row per step.
    """
    tensor = isinstance(z, Tensor)
    z = (z ^ ((z >> 30) & _LOW34)) * _MIX1
    if not tensor:
        z &= _MASK64
    z = (z ^ ((z >> 27) & _LOW37)) * _MIX2
    if not tensor:
        z &= _MASK64
    return z ^ ((z >> 31) & _LOW33)


def random_bits(seed: Tensor, step: Tensor) -> Tensor:
    """64 random bits (as int64) per element of broadcast(seed, step).

    The seed is mixed once before use as the SplitMix64 state so that seeds that
    differ by a multiple of the gamma do not yield shifted copies of one stream.
    ``step`` t gives the (t+1)-th SplitMix64 output of that state.
    """
    key = mix64(seed.to(torch.int64))
    return mix64(key + (step.to(torch.int64) + 1) * GOLDEN_GAMMA)


def uniform(seed: Tensor, step: Tensor) -> Tensor:
    """One float64 in [0, 1) per element, from the top 53 random bits."""
    return _shr(random_bits(seed, step), 11).to(torch.float64) * (2.0**-53)


# ---- the same draws in Python integers ---------------------------------------------------
# For a handful of CPU rows the ~25 tensor ops above cost more than the arithmetic: these
# compute the same bits with exact unsigned 64-bit integers (mod 2**64, as int64 wraps).


def row_keys(seeds: list[int]) -> list[int]:
    """Each int64 seed mixed into its SplitMix64 state (``random_bits``' ``key``), as an
    unsigned Python int: a row's part of its draws that does not change with the step."""
    return [mix64(seed & _MASK64) for seed in seeds]


def uniform_of_keys(keys: list[int], steps: list[int]) -> list[float]:
    """``uniform(seed, step)`` from ``row_keys(seeds)``: the same float64 values, bit for bit."""
    gamma = GOLDEN_GAMMA & _MASK64
    return [
        (mix64((key + ((step + 1) & _MASK64) * gamma) & _MASK64) >> 11) * 2.0**-53
        for key, step in zip(keys, steps, strict=True)
    ]


def uniform_host(seeds: list[int], steps: list[int]) -> list[float]:
    """``uniform(seed, step)`` for int64 seeds and steps given as Python ints: the same
    float64 values, bit for bit."""
    return uniform_of_keys(row_keys(seeds), steps)
