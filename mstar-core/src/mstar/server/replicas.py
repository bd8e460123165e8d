"""Picking a replica of a replicated device group for a request.

A request runs in exactly one replica of each group it needs, picked once, when it is
submitted, and kept for its whole life: its partitions in one group share that replica's
process (and the signals persisted between its walks), and every stream item another group
emits for it goes to that replica. Groups are picked independently; a policy that wants
two replicated groups paired picks the same index in both.

The ``mstar_route_replica`` hook picks (a general plugin may override a model's policy with
``tryfirst``); when it answers ``None``, the default picks the serving replica with the
fewest outstanding requests, the lowest index on a tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mstar.api.errors import ApiError


@dataclass(frozen=True)
class ReplicaStats:
    """What a routing policy knows about one replica of a group, at submission time."""

    index: int  # the replica's position in the group (what a policy returns)
    engine: str  # its engine process name (``group/index``)
    device: str
    serving: bool  # alive and ready: a request sent to it runs
    outstanding: int  # requests this server sent it that it has not finished
    waiting: int  # from its latest statistics report (0 before the first)
    running: int


def least_outstanding(replicas: Sequence[ReplicaStats]) -> int:
    """The default policy: the serving replica with the fewest outstanding requests, the
    lowest index on a tie; index 0 when none serves (the request then gets a 503)."""
    serving = [r for r in replicas if r.serving]
    if not serving:
        return 0
    return min(serving, key=lambda r: (r.outstanding, r.index)).index


# (group, request kwargs, requested output signals or None for all, replicas) -> index or None
Policy = Callable[[str, dict[str, Any], list[str] | None, list[ReplicaStats]], int | None]


def choose_replica(
    policy: Policy | None,
    group: str,
    kwargs: dict[str, Any],
    signals: list[str] | None,
    replicas: list[ReplicaStats],
) -> int:
    """The policy's pick, the default's when it has none; a pick that names no replica is
    the policy's bug, a 500 that says so."""
    picked = policy(group, kwargs, signals, replicas) if policy is not None else None
    if picked is None:
        return least_outstanding(replicas)
    if isinstance(picked, bool) or not isinstance(picked, int) or not 0 <= picked < len(replicas):
        raise ApiError(
            500,
            f"the replica routing policy picked {picked!r} for group {group!r}, which has replicas 0..{len(replicas) - 1}",
            code="routing_error",
        )
    return picked


def hook_policy(hook: Any, model_name: str) -> Policy:
    """The ``mstar_route_replica`` hook as a ``Policy``."""

    def policy(group: str, kwargs: dict[str, Any], signals: list[str] | None, replicas: list[ReplicaStats]) -> int | None:
        return hook.mstar_route_replica(
            model_name=model_name, group=group, request_kwargs=kwargs, output_signals=signals, replicas=replicas
        )

    return policy
