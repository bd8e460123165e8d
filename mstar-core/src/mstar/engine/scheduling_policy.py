"""Which ready group runs next, and in which order its rows are taken.

A policy object, not ``if`` chains: swap it to change priorities.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol

from mstar.engine.request import Request


class ReadyRow(Protocol):
    req: Request
    ready_since: int


class SchedulingPolicy(Protocol):
    def pick_group(self, groups: Mapping[Hashable, Sequence[ReadyRow]]) -> Hashable: ...

    def order_rows(self, rows: Sequence[ReadyRow]) -> list[ReadyRow]: ...

    def preemption_victim(self, holders: Sequence[Request]) -> Request: ...


class FairOldestFirst:
    """Run the (node, walk) group whose row has waited longest, so every node and walk
    gets its turn; inside a group, higher priority then earlier arrival first; preempt the
    lowest-priority, latest-arrived request."""

    def pick_group(self, groups: Mapping[Hashable, Sequence[ReadyRow]]) -> Hashable:
        return min(groups, key=lambda k: min((-r.req.priority, r.ready_since, r.req.arrival) for r in groups[k]))

    def order_rows(self, rows: Sequence[ReadyRow]) -> list[ReadyRow]:
        return sorted(rows, key=lambda r: (-r.req.priority, r.req.arrival))

    def preemption_victim(self, holders: Sequence[Request]) -> Request:
        return min(holders, key=lambda r: (r.priority, -r.arrival))
