"""Placement: which nodes run in which engine process (device group).

YAML form::

    groups:
      talker: {device: cuda:1, nodes: [talker, code2wav]}
      thinker: {device: cuda:0, nodes: [thinker]}

Without a file the model spec's ``default_placement`` (node -> group) is used. A walk
partition must sit whole in one group (an engine runs only partitions whose nodes are all
local); streaming edges between partitions may cross groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar.graph import GraphSpec
from mstar.graph.spec import iter_steps


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class DeviceGroup:
    name: str
    device: str
    nodes: tuple[str, ...]
    # Ray backend: the resource request of each engine of the group, and a node's IP.
    resources: tuple[tuple[str, float], ...] = ()
    node: str | None = None


@dataclass(frozen=True)
class Placement:
    groups: tuple[DeviceGroup, ...]

    def group_of_node(self, node: str) -> str:
        return next(g.name for g in self.groups if node in g.nodes)

    def stream_routes(self, graph: GraphSpec) -> dict[str, str]:
        """Streaming signal -> the group consuming it (where its items must be pushed)."""
        hosts = partition_hosts(graph, self)
        return {
            name: hosts[sig.stream.into_partition]
            for name, sig in graph.stream_edges().items()
            if sig.stream is not None and sig.stream.into_partition in hosts
        }


def partition_nodes(graph: GraphSpec) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {p: set() for p in graph.partitions}
    for walk in graph.walks.values():
        out[walk.partition].update(s.node for s in iter_steps(walk.body))
    return out


def partition_hosts(graph: GraphSpec, placement: Placement) -> dict[str, str]:
    return {
        p: placement.group_of_node(next(iter(nodes)))
        for p, nodes in partition_nodes(graph).items()
        if nodes
    }


def default_device_for(group: str, device: str) -> str:
    # Default placements name groups "0", "1", ...: device indices on an accelerator.
    if device != "cpu" and ":" not in device and group.isdigit():
        return f"{device}:{group}"
    return device


def placement_from_mapping(node_to_group: dict[str, str], device: str) -> Placement:
    groups: dict[str, list[str]] = {}
    for node, group in node_to_group.items():
        groups.setdefault(str(group), []).append(node)
    return Placement(tuple(DeviceGroup(g, default_device_for(g, device), tuple(n)) for g, n in groups.items()))


def parse_placement(data: Any, source: str = "placement") -> Placement:
    """Groups with their optional Ray keys (``resources``, ``node``; ``mstar.server.placement_location``)."""
    from mstar.server.placement_location import with_locations

    return with_locations(data, source, _parse_groups)


def _parse_groups(data: Any, source: str) -> Placement:
    if not isinstance(data, dict) or not isinstance(data.get("groups"), dict) or not data["groups"]:
        raise PlacementError(f"{source}: expected a mapping with a non-empty 'groups' mapping")
    groups = []
    for name, body in data["groups"].items():
        if not isinstance(body, dict):
            raise PlacementError(f"{source}: group {name!r} must be a mapping with 'device' and 'nodes'")
        unknown = set(body) - {"device", "nodes"}
        if unknown:
            raise PlacementError(f"{source}: group {name!r} has unknown key(s) {sorted(unknown)}; allowed: device, nodes")
        nodes = body.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
            raise PlacementError(f"{source}: group {name!r} needs 'nodes': a non-empty list of node names")
        groups.append(DeviceGroup(str(name), str(body.get("device", "cpu")), tuple(nodes)))
    return Placement(tuple(groups))


def load_placement(path: str | Path | None, default: dict[str, str], device: str) -> Placement:
    if path is None:
        if not default:
            raise PlacementError("the model declares no default placement; pass --config placement.yaml")
        return placement_from_mapping(dict(default), device)
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PlacementError(f"cannot read placement {path}: {exc}") from None
    return parse_placement(data, str(path))


def validate_placement(placement: Placement, graph: GraphSpec) -> None:
    seen: dict[str, str] = {}
    for g in placement.groups:
        for node in g.nodes:
            if node not in graph.nodes:
                raise PlacementError(f"group {g.name!r} places unknown node {node!r}; the model's nodes: {sorted(graph.nodes)}")
            if node in seen:
                raise PlacementError(f"node {node!r} is placed in two groups: {seen[node]!r} and {g.name!r}")
            seen[node] = g.name
    missing = set(graph.nodes) - set(seen)
    if missing:
        raise PlacementError(f"node(s) {sorted(missing)} are placed in no group")
    for partition, nodes in partition_nodes(graph).items():
        hosts = {seen[n] for n in nodes}
        if len(hosts) > 1:
            raise PlacementError(
                f"partition {partition!r} (nodes {sorted(nodes)}) spans groups {sorted(hosts)}; "
                "a partition's nodes must share one group"
            )


def request_engines(graph: GraphSpec, placement: Placement) -> Callable[[Mapping[str, Any]], set[str]]:
    """The engines a request needs: those hosting a partition whose first walk runs for the
    request's kwargs (a text-only request never reaches a speech partition's engine)."""
    hosts = partition_hosts(graph, placement)

    def engines_for(kwargs: Mapping[str, Any]) -> set[str]:
        return {host for p, host in hosts.items() if graph.state_machine.first_walk(p, kwargs) is not None}

    return engines_for
