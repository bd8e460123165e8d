from __future__ import annotations

import pytest
from mstar.server.placement import (
    PlacementError,
    load_placement,
    parse_placement,
    validate_placement,
)


@pytest.fixture(scope="module")
def graph():
    from mstar_toy.config import DEFAULT_CONFIG
    from mstar_toy.plugin import build_graph

    return build_graph(DEFAULT_CONFIG)


def test_default_placement_is_one_group(graph):
    p = load_placement(None, {"lm": "0", "decoder": "0"}, "cpu")
    validate_placement(p, graph)
    assert [(g.name, g.device, set(g.nodes)) for g in p.groups] == [("0", "cpu", {"lm", "decoder"})]
    assert p.stream_routes(graph) == {"codes": "0"}


def test_default_placement_on_accelerator_uses_group_index():
    p = load_placement(None, {"lm": "0", "decoder": "1"}, "cuda")
    assert [g.device for g in p.groups] == ["cuda:0", "cuda:1"]


def test_two_groups_route_the_stream_to_the_decoder(graph, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("groups:\n  a: {device: cpu, nodes: [lm]}\n  b: {nodes: [decoder]}\n")
    p = load_placement(path, {}, "cpu")
    validate_placement(p, graph)
    assert p.stream_routes(graph) == {"codes": "b"}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"groups": {"a": {"nodes": ["lm", "nope"]}}}, "unknown node 'nope'"),
        ({"groups": {"a": {"nodes": ["lm"]}, "b": {"nodes": ["lm", "decoder"]}}}, "placed in two groups"),
        ({"groups": {"a": {"nodes": ["lm"]}}}, r"\['decoder'\] are placed in no group"),
    ],
)
def test_invalid_placements(graph, data, match):
    with pytest.raises(PlacementError, match=match):
        validate_placement(parse_placement(data), graph)


@pytest.mark.parametrize("data", [None, {"groups": {}}, {"groups": {"a": {"nodes": []}}}, {"groups": {"a": {"nodes": ["x"], "gpu": 1}}}])
def test_malformed_yaml(data):
    with pytest.raises(PlacementError):
        parse_placement(data)


def test_a_request_reaches_only_the_engines_its_walks_run_on(graph, tmp_path):
    from dataclasses import replace

    from mstar.graph import LinearWalks
    from mstar.server.placement import request_engines

    class TextOnlySkipsAudio(LinearWalks):
        def first_walk(self, partition, request_kwargs):
            if partition == "audio" and request_kwargs.get("text_only"):
                return None
            return super().first_walk(partition, request_kwargs)

    skipping = replace(graph, state_machine=TextOnlySkipsAudio(graph.state_machine.order))
    path = tmp_path / "p.yaml"
    path.write_text("groups:\n  a: {device: cpu, nodes: [lm]}\n  b: {nodes: [decoder]}\n")
    engines_for = request_engines(skipping, load_placement(path, {}, "cpu"))
    assert engines_for({}) == {"a", "b"}
    assert engines_for({"text_only": True}) == {"a"}


def test_tensor_parallel_groups_parse_and_bad_values_are_named():
    from mstar.server.placement import parse_placement
    from mstar.server.placement_error import PlacementError as Error

    placement = parse_placement({"groups": {"lm": {"device": "cuda:0", "nodes": ["lm"], "tensor_parallel": 2}}})
    [slot] = placement.engine_slots()
    assert (slot.name, slot.tensor_parallel, slot.device) == ("lm", 2, "cuda:0")
    for bad in (0, "2", True, 1.5):
        with pytest.raises(Error, match="'tensor_parallel' must be an integer >= 1"):
            parse_placement({"groups": {"lm": {"nodes": ["lm"], "tensor_parallel": bad}}})
    with pytest.raises(Error, match="with 'replicas' is not supported"):
        parse_placement({"groups": {"lm": {"nodes": ["lm"], "tensor_parallel": 2, "replicas": 2}}})


def test_expert_parallel_parses_and_travels_in_the_engine_spec():
    import msgspec
    from mstar.server.engine_process import EngineProcessSpec
    from mstar.server.placement import parse_placement
    from mstar.server.placement_error import PlacementError as Error
    from mstar.server.tensor_parallel_ranks import tensor_parallel_options

    groups = {"lm": {"nodes": ["lm"], "tensor_parallel": 2, "expert_parallel": True}, "codec": {"nodes": ["codec"]}}
    lm, codec = parse_placement({"groups": groups}).engine_slots()
    assert (lm.expert_parallel, codec.expert_parallel) == (True, False)
    # The follower ranks decode the engine's spec as plain fields: the flag survives the trip.
    fields = msgspec.structs.fields(EngineProcessSpec)
    assert any(f.name == "expert_parallel" for f in fields)
    assert tensor_parallel_options(2, 1, "tcp://x", True)["expert_parallel"] is True
    for bad, message in ((1, "must be true or false"), ("yes", "must be true or false")):
        with pytest.raises(Error, match=message):
            parse_placement({"groups": {"lm": {"nodes": ["lm"], "tensor_parallel": 2, "expert_parallel": bad}}})
    with pytest.raises(Error, match="'expert_parallel' needs 'tensor_parallel' of 2 or more"):
        parse_placement({"groups": {"lm": {"nodes": ["lm"], "expert_parallel": True}}})


def test_rank_devices_follow_rank_zeros():
    from mstar.server.tensor_parallel_ranks import rank_device

    assert [rank_device("cuda:2", r) for r in range(3)] == ["cuda:2", "cuda:3", "cuda:4"]
    assert [rank_device("cuda", r) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert rank_device("cpu", 1) == "cpu"
