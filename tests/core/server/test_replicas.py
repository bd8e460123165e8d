"""Replicated placement groups: YAML parsing, the default routing policy, the routing hook,
and the router keeping a request on its replicas (stream items follow it there)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pluggy
import pytest
import torch
from mstar.api.errors import ApiError
from mstar.plugins import hookspecs
from mstar.server.messages import AbortRequest, AddRequest, Event, PushStream
from mstar.server.placement import PlacementError, parse_placement, validate_placement
from mstar.server.replicas import ReplicaStats, choose_replica, hook_policy, least_outstanding
from mstar.server.router import Finished, Router
from mstar.server.tensor_codec import TensorCodec


@pytest.fixture(scope="module")
def graph():
    from mstar_toy.config import DEFAULT_CONFIG
    from mstar_toy.plugin import build_graph

    return build_graph(DEFAULT_CONFIG)


# ---- placement ---------------------------------------------------------------------------
def test_replicas_become_engine_processes(graph):
    p = parse_placement({"groups": {
        "lm_g": {"device": "cpu", "nodes": ["lm"], "replicas": 2},
        "dec_g": {"devices": ["cuda:0", "cuda:1", "cuda:3"], "nodes": ["decoder"]},
    }})
    validate_placement(p, graph)
    assert [(s.name, s.group, s.replica, s.device) for s in p.engine_slots()] == [
        ("lm_g/0", "lm_g", 0, "cpu"), ("lm_g/1", "lm_g", 1, "cpu"),
        ("dec_g/0", "dec_g", 0, "cuda:0"), ("dec_g/1", "dec_g", 1, "cuda:1"), ("dec_g/2", "dec_g", 2, "cuda:3"),
    ]
    assert p.group_engines() == {"lm_g": ("lm_g/0", "lm_g/1"), "dec_g": ("dec_g/0", "dec_g/1", "dec_g/2")}
    assert p.stream_routes(graph) == {"codes": "dec_g"}  # streams name the group; the router picks the replica


def test_one_replica_keeps_the_group_name():
    p = parse_placement({"groups": {"a": {"nodes": ["lm", "decoder"], "replicas": 1, "device": "cuda:2"}}})
    assert [(s.name, s.device) for s in p.engine_slots()] == [("a", "cuda:2")]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"replicas": 0}, r"'replicas' must be an integer >= 1, got 0"),
        ({"replicas": -2}, r"'replicas' must be an integer >= 1, got -2"),
        ({"replicas": "2"}, r"'replicas' must be an integer >= 1, got '2'"),
        ({"replicas": True}, r"'replicas' must be an integer >= 1, got True"),
        ({"replicas": 3, "devices": ["cuda:0", "cuda:1"]}, r"'devices' lists 2 device\(s\) for 3 replica\(s\); give one per replica"),
        ({"devices": []}, r"'devices' must be a non-empty list"),
        ({"devices": "cuda:0"}, r"'devices' must be a non-empty list"),
        ({"device": "cuda:0", "devices": ["cuda:0", "cuda:1"]}, r"give 'device' \(every replica\) or 'devices'"),
        ({"replica": 2}, r"unknown key\(s\) \['replica'\]; allowed: device, devices, nodes, replicas"),
    ],
)
def test_bad_replica_yaml_is_a_placement_error(body, match):
    with pytest.raises(PlacementError, match=r"group 'g'.*" + match):
        parse_placement({"groups": {"g": {"nodes": ["lm"], **body}}})


def test_a_replica_name_clashing_with_a_group_is_refused():
    with pytest.raises(PlacementError, match=r"engine name\(s\) \['g/1'\] are used twice"):
        parse_placement({"groups": {"g": {"nodes": ["lm"], "replicas": 2}, "g/1": {"nodes": ["decoder"]}}})


# ---- policies ----------------------------------------------------------------------------
def stats(*outstanding: int, down: tuple[int, ...] = ()) -> list[ReplicaStats]:
    return [ReplicaStats(i, f"g/{i}", "cpu", i not in down, n, 0, 0) for i, n in enumerate(outstanding)]


@pytest.mark.parametrize(
    ("replicas", "picked"),
    [
        (stats(0, 0), 0),  # a tie: the lowest index
        (stats(2, 1, 1), 1),
        (stats(0, 5, down=(0,)), 1),  # a replica that is down is never picked
        (stats(3, 3, down=(0, 1)), 0),  # none serves: index 0 (its 503 follows)
    ],
)
def test_default_policy_least_outstanding(replicas, picked):
    assert least_outstanding(replicas) == picked
    assert choose_replica(None, "g", {}, None, replicas) == picked
    assert choose_replica(lambda *a: None, "g", {}, None, replicas) == picked  # None: the default


@pytest.mark.parametrize("bad", [2, -1, "1", True, 1.0])
def test_a_policy_naming_no_replica_is_a_500(bad):
    with pytest.raises(ApiError, match=r"picked .* for group 'g', which has replicas 0\.\.1") as err:
        choose_replica(lambda *a: bad, "g", {}, None, stats(0, 0))
    assert err.value.status == 500


def test_the_hook_reaches_a_plugin_that_takes_fewer_arguments():
    class ByModality:
        @hookspecs.hookimpl
        def mstar_route_replica(self, group, output_signals, replicas):
            if group != "enc":
                return None
            return len(replicas) - 1 if output_signals and "audio" in output_signals else 0

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(ByModality())
    policy = hook_policy(pm.hook, "m")
    assert policy("enc", {}, ["token", "audio"], stats(0, 0, 0)) == 2
    assert policy("enc", {}, ["token"], stats(0, 0, 0)) == 0
    assert policy("other", {}, ["audio"], stats(0, 0)) is None


# ---- the router ----------------------------------------------------------------------------
class FakeEngine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list = []
        self.down_reason: str | None = None
        self.spec = SimpleNamespace(device="cpu")
        self.stats = None

    @property
    def alive(self) -> bool:
        return self.down_reason is None

    serving = alive

    def unavailable_reason(self) -> str:
        return self.down_reason or "is starting"

    def send(self, cmd) -> None:
        self.sent.append(cmd)

    def requests(self) -> list[str]:
        return [c.request_id for c in self.sent if isinstance(c, AddRequest)]


GROUPS = {"lm_g": ("lm_g/0", "lm_g/1"), "dec_g": ("dec_g/0", "dec_g/1")}


def replicated_router(policy=None):
    engines = {n: FakeEngine(n) for names in GROUPS.values() for n in names}
    codec = TensorCodec("mstar_replicatest_", threshold=1 << 20)
    return Router(engines, {"codes": "dec_g"}, codec, replicas=GROUPS, policy=policy), engines, codec


def drain(stream) -> list:
    """Everything up to the request's end; a request that never ends fails the test."""

    async def run():
        items = []
        while True:
            batch = await asyncio.wait_for(stream.next_batch(), 5)
            items += batch
            if isinstance(batch[-1], Finished):
                return items

    return asyncio.run(run())


def test_default_spreads_requests_and_streams_follow_them():
    router, engines, codec = replicated_router()
    a = router.submit("a", {}, {}, {}, None)
    b = router.submit("b", {}, {}, {}, None)
    assert (a.routes, b.routes) == ({"dec_g": "dec_g/0", "lm_g": "lm_g/0"}, {"dec_g": "dec_g/1", "lm_g": "lm_g/1"})
    assert [engines[n].requests() for n in ("lm_g/0", "lm_g/1", "dec_g/0", "dec_g/1")] == [["a"], ["b"], ["a"], ["b"]]
    assert router.outstanding("lm_g/0") == 1 and router.outstanding("lm_g/1") == 1
    # b's codes, from lm_g/1, go to b's decoder replica only
    item = torch.tensor([[5, 6]])
    router.on_events("lm_g/1", [Event("b", "codes", codec.encode(item), stream_item=True)])
    (push,) = [c for c in engines["dec_g/1"].sent if isinstance(c, PushStream)]
    assert push.request_id == "b" and torch.equal(codec.decode(push.value), item)
    assert not [c for c in engines["dec_g/0"].sent if isinstance(c, PushStream)]
    # a finishes on both of its replicas: the next request goes back to replica 0 (1 vs 0 outstanding)
    router.on_events("lm_g/0", [Event("a", finished=True, finish_reason="stop")])
    router.on_events("dec_g/0", [Event("a", finished=True, finish_reason="stop")])
    assert drain(a)[-1] == Finished("stop")
    c = router.submit("c", {}, {}, {}, None)
    assert c.routes == {"dec_g": "dec_g/0", "lm_g": "lm_g/0"}


def test_a_dead_replica_fails_only_its_requests_and_gets_no_new_ones():
    router, engines, _ = replicated_router()
    a = router.submit("a", {}, {}, {}, None)
    b = router.submit("b", {}, {}, {}, None)
    engines["lm_g/1"].down_reason = "was killed by signal 9"
    router.engine_down("lm_g/1", "was killed by signal 9")
    assert drain(b)[-1] == Finished("error", "engine 'lm_g/1' was killed by signal 9", 503)
    assert isinstance(engines["dec_g/1"].sent[-1], AbortRequest)  # its other replica lets go of it
    assert "a" in router.streams and not a.done
    c = router.submit("c", {}, {}, {}, None)  # 1 outstanding on lm_g/0, but lm_g/1 is down
    assert c.routes["lm_g"] == "lm_g/0"


def test_a_policy_that_picks_a_dead_replica_gets_a_503():
    router, engines, _ = replicated_router(policy=lambda group, kwargs, signals, replicas: 1)
    engines["lm_g/1"].down_reason = "exited with code 1"
    with pytest.raises(ApiError, match="engine 'lm_g/1' exited with code 1") as err:
        router.submit("a", {}, {}, {}, None)
    assert err.value.status == 503 and "a" not in router.streams
    assert not engines["lm_g/0"].sent and not engines["dec_g/1"].sent


def test_policy_routes_by_output_signals_per_group():
    def by_audio(group, kwargs, signals, replicas):
        return 1 if signals and "audio" in signals else 0

    router, engines, _ = replicated_router(policy=by_audio)
    for i in range(3):  # the policy, not the load, decides
        router.submit(f"speech{i}", {}, {}, {}, ["audio"])
        router.submit(f"text{i}", {}, {}, {}, ["token"])
    assert engines["lm_g/1"].requests() == engines["dec_g/1"].requests() == ["speech0", "speech1", "speech2"]
    assert engines["lm_g/0"].requests() == engines["dec_g/0"].requests() == ["text0", "text1", "text2"]


def test_replica_stats_describe_each_replica():
    from mstar.server.messages import EngineStats

    router, engines, _ = replicated_router()
    engines["lm_g/1"].stats = EngineStats(3, 2, 2, [])
    engines["lm_g/0"].down_reason = "is starting"
    router.submit("a", {}, {}, {}, None)
    assert router.replica_stats("lm_g") == [
        ReplicaStats(0, "lm_g/0", "cpu", False, 0, 0, 0),
        ReplicaStats(1, "lm_g/1", "cpu", True, 1, 3, 2),
    ]


def test_a_pinned_request_uses_that_replica_in_every_group():
    router, engines, _ = replicated_router(policy=lambda *a: 0)
    router.pinned["w1"] = 1
    router.pinned["w3"] = 3  # modulo each group's count
    assert router.submit("w1", {}, {}, {}, None).routes == {"dec_g": "dec_g/1", "lm_g": "lm_g/1"}
    assert router.submit("w3", {}, {}, {}, None).routes == {"dec_g": "dec_g/1", "lm_g": "lm_g/1"}
    assert router.submit("next", {}, {}, {}, None).routes == {"dec_g": "dec_g/0", "lm_g": "lm_g/0"}  # the policy again
    assert router.pinned == {}


def test_a_stream_into_a_replicated_group_the_request_skips_is_dropped_and_freed():
    from pathlib import Path

    engines = {n: FakeEngine(n) for names in GROUPS.values() for n in names}
    codec = TensorCodec("mstar_replicaskip_", threshold=0)  # every tensor through shared memory
    router = Router(engines, {"codes": "dec_g"}, codec, engines_for=lambda kwargs: {"lm_g"}, replicas=GROUPS)
    router.submit("t", {}, {}, {}, None)
    item = codec.encode(torch.ones(4))
    assert item.shm is not None and list(Path("/dev/shm").glob("mstar_replicaskip_*"))
    router.on_events("lm_g/0", [Event("t", "codes", item, stream_item=True)])
    assert not any(isinstance(c, PushStream) for e in engines.values() for c in e.sent)
    assert not list(Path("/dev/shm").glob("mstar_replicaskip_*"))
