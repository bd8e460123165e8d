"""The one error a checkpoint that does not fit its module raises."""

from __future__ import annotations

from collections.abc import Sequence

# Names listed per kind before the rest is only counted: enough to see the pattern.
LISTED = 8


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the module's: missing keys, unexpected keys
    or shape mismatches, all listed in one message, raised before any tensor is copied."""


def listing(kind: str, items: Sequence[str]) -> str:
    """``kind (count): [first LISTED] +N more``."""
    items = sorted(items)
    more = f" +{len(items) - LISTED} more" if len(items) > LISTED else ""
    return f"{kind} ({len(items)}): {items[:LISTED]}{more}"


def mismatch_error(where: str, module: str, missing: Sequence[str], unexpected: Sequence[str],
                   wrong_shapes: Sequence[str]) -> CheckpointMismatchError | None:
    """The error for these problems, or None when there are none."""
    parts = [listing(kind, items) for kind, items in
             (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", wrong_shapes)) if items]
    if not parts:
        return None
    return CheckpointMismatchError(f"{where} does not match {module}:\n  " + "\n  ".join(parts))
