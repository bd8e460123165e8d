"""Which checkpoint keys are a module's, and under which names.

A key under ``skip`` belongs to another component and is passed over; a key under
``prefix`` is the module's: with the prefix removed, unless an ``ignore`` pattern matches
it, it is renamed by each ``renames`` rule in turn into the module's naming. A key outside
both is another component's too when ``skip`` is None, and unexpected otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mstar.weights.errors import CheckpointMismatchError


@dataclass
class CheckpointNames:
    own: dict[str, str] = field(default_factory=dict)  # module-side name -> checkpoint key
    stray: list[str] = field(default_factory=list)  # keys no component claims (unexpected)


def checkpoint_names(
    keys: Iterable[str],
    prefix: str = "",
    skip: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
    renames: Iterable[tuple[str, str]] = (),
) -> CheckpointNames:
    skipped = tuple(skip or ())
    ignored = [re.compile(p) for p in ignore]
    rules = [(re.compile(p), r) for p, r in renames]
    out = CheckpointNames()
    claimed: dict[str, list[str]] = {}
    for key in keys:
        if key.startswith(skipped):
            continue
        if not key.startswith(prefix):
            if skip is not None:
                out.stray.append(key)
            continue
        name = key[len(prefix):]
        if any(p.search(name) for p in ignored):
            continue
        for pattern, replacement in rules:
            name = pattern.sub(replacement, name)
        claimed.setdefault(name, []).append(key)
    clashes = sorted(f"{keys} -> {name}" for name, keys in claimed.items() if len(keys) > 1)
    if clashes:
        raise CheckpointMismatchError(f"keys renamed onto the same name: {clashes[:8]}")
    out.own = {name: keys[0] for name, keys in claimed.items()}
    return out
