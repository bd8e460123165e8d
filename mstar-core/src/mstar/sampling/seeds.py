"""Seed helpers: fresh per-request seeds and stable per-label derivation."""

from __future__ import annotations

import hashlib
import secrets

#: Seeds are non-negative and fit a signed int64 so they can live in torch buffers.
MAX_SEED = 2**63 - 1

# Domain separation so aux-seed hashes never collide with other blake2b uses.
_PERSON = b"mstar-aux-seed"


def fresh_seed() -> int:
    """A new random 63-bit seed from the OS CSPRNG (never a fixed default)."""
    return secrets.randbits(63)


def derive_seed(seed: int, label: str) -> int:
    """Stable seed for an auxiliary sampler, from the request seed and its label.

    This is part of the reproducibility contract: changing it changes every
    seeded aux output, so it is pinned by a golden-value test.
    """
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}], got {seed}")
    digest = hashlib.blake2b(
        seed.to_bytes(8, "little") + label.encode("utf-8"), digest_size=8, person=_PERSON
    ).digest()
    return int.from_bytes(digest, "little") & MAX_SEED
