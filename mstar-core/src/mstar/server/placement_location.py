"""The Ray keys of a placement group: where its engines may run.

YAML form (per group, next to ``device`` and ``nodes``)::

    groups:
      thinker: {device: cuda:0, nodes: [thinker], resources: {GPU: 1, big_node: 1}}
      talker: {device: cpu, nodes: [talker, code2wav], node: 10.0.0.12}

``resources`` is the Ray resource request of each engine of the group (``CPU``, default 1;
``GPU``; ``memory`` in bytes; any custom resource a node was started with); ``node`` pins the
group to the node with that IP (Ray's ``node:<ip>`` resource). The local backend ignores
both.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

from mstar.server.placement_error import PlacementError

LOCATION_KEYS = ("resources", "node")


def _resources(group: str, value: Any, source: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict) or not value:
        raise PlacementError(f"{source}: group {group!r}: 'resources' must be a mapping of resource name to amount, e.g. {{GPU: 1}}")
    out = []
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
            raise PlacementError(f"{source}: group {group!r}: resource {name!r} needs a non-negative number, got {amount!r}")
        out.append((str(name), float(amount)))
    return tuple(out)


def _node(group: str, value: Any, source: str) -> str:
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        raise PlacementError(f"{source}: group {group!r}: 'node' must be a node's IP address, got {value!r}") from None


def with_locations(data: Any, source: str, parse_groups: Callable[[Any, str], Any]) -> Any:
    """``parse_groups`` over ``data`` without the location keys, then each group with its
    ``resources`` and ``node``."""
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, dict):
        return parse_groups(data, source)
    found: dict[str, dict[str, Any]] = {}
    stripped: dict[Any, Any] = {}
    for name, body in groups.items():
        if isinstance(body, dict) and any(k in body for k in LOCATION_KEYS):
            location: dict[str, Any] = {}
            if "resources" in body:
                location["resources"] = _resources(str(name), body["resources"], source)
            if "node" in body:
                location["node"] = _node(str(name), body["node"], source)
            found[str(name)] = location
            body = {k: v for k, v in body.items() if k not in LOCATION_KEYS}
        stripped[name] = body
    placement = parse_groups({**data, "groups": stripped}, source)
    if not found:
        return placement
    return dataclasses.replace(
        placement, groups=tuple(dataclasses.replace(g, **found.get(g.name, {})) for g in placement.groups)
    )
