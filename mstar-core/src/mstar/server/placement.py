"""Placement: which nodes run in which engine process (device group).

YAML form::

    groups:
      talker: {device: cuda:1, nodes: [talker, code2wav]}
      thinker: {device: cuda:0, nodes: [thinker]}
      encoders: {devices: [cuda:0, cuda:1], nodes: [audio_encoder]}  # two replicas

Without a file the model spec's ``default_placement`` (node -> group) is used. A walk
partition must sit whole in one group (an engine runs only partitions whose nodes are all
local); streaming edges between partitions may cross groups.

A group may run as several replicas (``replicas: N``, all on ``device``, or ``devices``: one
device per replica): N engine processes with the same nodes. Each request runs in one
replica of each group it needs, picked when it is submitted (``mstar.server.replicas``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar.graph import GraphSpec
from mstar.graph.spec import iter_steps
from mstar.server.placement_error import PlacementError
from mstar.server.placement_location import with_locations


@dataclass(frozen=True)
class DeviceGroup:
    name: str
    device: str
    nodes: tuple[str, ...]
    replicas: int = 1
    devices: tuple[str, ...] = ()  # one per replica; empty: every replica on ``device``
    # Ray backend: the resource request of each engine of the group, and a node's IP.
    resources: tuple[tuple[str, float], ...] = ()
    node: str | None = None
    # Ranks of its engine (mstar.parallel): one process each, rank r on the device r after
    # ``device`` (CUDA) or on the CPU; the group's KV nodes split over them.
    tensor_parallel: int = 1
    # With tensor_parallel: MoE blocks that support it place whole experts on the ranks.
    expert_parallel: bool = False

    def replica_devices(self) -> tuple[str, ...]:
        return self.devices or (self.device,) * self.replicas

    def engine_names(self) -> tuple[str, ...]:
        """The engine process names: the group's own name when it has one replica, else
        ``name/0``, ``name/1``, ..."""
        if self.replicas == 1:
            return (self.name,)
        return tuple(f"{self.name}/{i}" for i in range(self.replicas))


@dataclass(frozen=True)
class EngineSlot:
    """One engine process of a placement: replica ``replica`` of group ``group``."""

    name: str
    group: str
    replica: int
    device: str
    nodes: tuple[str, ...]
    tensor_parallel: int = 1
    expert_parallel: bool = False


@dataclass(frozen=True)
class Placement:
    groups: tuple[DeviceGroup, ...]

    def engine_slots(self) -> tuple[EngineSlot, ...]:
        """Every engine process, group by group, replicas in order."""
        return tuple(
            EngineSlot(name, g.name, i, device, g.nodes, g.tensor_parallel, g.expert_parallel)
            for g in self.groups
            for i, (name, device) in enumerate(zip(g.engine_names(), g.replica_devices(), strict=True))
        )

    def group_engines(self) -> dict[str, tuple[str, ...]]:
        """Group -> its engine process names (one per replica)."""
        return {g.name: g.engine_names() for g in self.groups}

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


_GROUP_KEYS = ("device", "devices", "nodes", "replicas", "tensor_parallel", "expert_parallel")


def _replicas(name: str, body: dict[str, Any], source: str) -> tuple[str, int, tuple[str, ...]]:
    """(device, replicas, per-replica devices) of one group's YAML body."""
    devices = body.get("devices")
    if devices is not None:
        if "device" in body:
            raise PlacementError(f"{source}: group {name!r}: give 'device' (every replica) or 'devices' (one per replica), not both")
        if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
            raise PlacementError(f"{source}: group {name!r}: 'devices' must be a non-empty list of device names")
    replicas = body.get("replicas", len(devices) if devices else 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise PlacementError(f"{source}: group {name!r}: 'replicas' must be an integer >= 1, got {replicas!r}")
    if devices is None:
        return str(body.get("device", "cpu")), replicas, ()
    if len(devices) != replicas:
        raise PlacementError(f"{source}: group {name!r}: 'devices' lists {len(devices)} device(s) for {replicas} replica(s); give one per replica")
    return devices[0], replicas, tuple(devices)


def parse_placement(data: Any, source: str = "placement") -> Placement:
    """Groups with their optional Ray keys (``resources``, ``node``; ``mstar.server.placement_location``)."""
    return with_locations(data, source, _parse_groups)


def _parse_groups(data: Any, source: str) -> Placement:
    if not isinstance(data, dict) or not isinstance(data.get("groups"), dict) or not data["groups"]:
        raise PlacementError(f"{source}: expected a mapping with a non-empty 'groups' mapping")
    groups = []
    for name, body in data["groups"].items():
        if not isinstance(body, dict):
            raise PlacementError(f"{source}: group {name!r} must be a mapping with 'device' and 'nodes'")
        unknown = set(body) - set(_GROUP_KEYS)
        if unknown:
            raise PlacementError(f"{source}: group {name!r} has unknown key(s) {sorted(unknown)}; allowed: {', '.join(_GROUP_KEYS)}")
        nodes = body.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
            raise PlacementError(f"{source}: group {name!r} needs 'nodes': a non-empty list of node names")
        device, replicas, devices = _replicas(str(name), body, source)
        tp = body.get("tensor_parallel", 1)
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise PlacementError(f"{source}: group {name!r}: 'tensor_parallel' must be an integer >= 1, got {tp!r}")
        if tp > 1 and replicas > 1:
            raise PlacementError(f"{source}: group {name!r}: 'tensor_parallel' with 'replicas' is not supported yet; give one")
        ep = body.get("expert_parallel", False)
        if not isinstance(ep, bool):
            raise PlacementError(f"{source}: group {name!r}: 'expert_parallel' must be true or false, got {ep!r}")
        if ep and tp < 2:
            raise PlacementError(f"{source}: group {name!r}: 'expert_parallel' needs 'tensor_parallel' of 2 or more")
        groups.append(DeviceGroup(str(name), device, tuple(nodes), replicas, devices, tensor_parallel=tp, expert_parallel=ep))
    placement = Placement(tuple(groups))
    names = [slot.name for slot in placement.engine_slots()]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise PlacementError(f"{source}: engine name(s) {clash} are used twice (a replica of group G is named G/i); rename a group")
    return placement


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
