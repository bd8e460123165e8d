"""The Ray keys of a placement group (``resources``, ``node``): parsing, the actor options
they become, and the start-up check that some node can host each group. No Ray needed."""

from __future__ import annotations

import pytest
from mstar.server.engine_backend import LocalBackend, make_backend
from mstar.server.placement import PlacementError, parse_placement
from mstar.server.ray_engines import actor_options, check_feasible


def _placement(groups: dict):
    return parse_placement({"groups": groups})


def test_resources_and_node_are_parsed_per_group():
    p = _placement({
        "lm": {"device": "cuda:0", "nodes": ["lm"], "resources": {"GPU": 1, "lm_node": 1}},
        "dec": {"device": "cpu", "nodes": ["decoder"], "node": "10.0.0.2"},
        "plain": {"device": "cpu", "nodes": ["x"]},
    })
    lm, dec, plain = p.groups
    assert (lm.name, lm.device, lm.nodes, dict(lm.resources), lm.node) == ("lm", "cuda:0", ("lm",), {"GPU": 1.0, "lm_node": 1.0}, None)
    assert (dec.resources, dec.node) == ((), "10.0.0.2")
    assert (plain.resources, plain.node) == ((), None)


@pytest.mark.parametrize("body,message", [
    ({"resources": {"GPU": -1}}, "non-negative number"),
    ({"resources": {"GPU": True}}, "non-negative number"),
    ({"resources": []}, "must be a mapping"),
    ({"node": "not-an-ip"}, "IP address"),
    ({"zone": "a"}, "unknown key"),
])
def test_bad_location_keys_are_one_line_errors(body, message):
    with pytest.raises(PlacementError, match=message):
        _placement({"g": {"device": "cpu", "nodes": ["lm"], **body}})


def test_actor_options():
    lm, dec, plain = _placement({
        "lm": {"nodes": ["lm"], "resources": {"GPU": 1, "CPU": 4, "memory": 1e9, "lm_node": 1}},
        "dec": {"nodes": ["decoder"], "node": "10.0.0.2"},
        "plain": {"nodes": ["x"]},
    }).groups
    assert actor_options(lm) == {"num_cpus": 4.0, "num_gpus": 1.0, "max_restarts": 0, "max_concurrency": 2,
                                 "memory": 1e9, "resources": {"lm_node": 1.0}}
    assert actor_options(dec)["resources"] == {"node:10.0.0.2": 0.001}
    assert actor_options(plain) == {"num_cpus": 1, "num_gpus": 0, "max_restarts": 0, "max_concurrency": 2}


def test_a_group_no_node_can_host_fails_start_up():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 2.0, "node_a": 1.0, "node:10.0.0.1": 1.0}},
        {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0, "node_b": 1.0, "node:10.0.0.2": 1.0}},
        {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 8.0, "node_c": 1.0}},
    ]
    ok = _placement({"a": {"nodes": ["x"], "resources": {"node_a": 1}}, "b": {"nodes": ["y"], "resources": {"GPU": 1}, "node": "10.0.0.2"}})
    check_feasible(ok, nodes)
    # each resource exists somewhere, but not together on one node
    split = _placement({"a": {"nodes": ["x"], "resources": {"GPU": 1, "node_a": 1}}})
    with pytest.raises(ValueError, match="group 'a' requests"):
        check_feasible(split, nodes)
    dead_only = _placement({"c": {"nodes": ["x"], "resources": {"node_c": 1}}})
    with pytest.raises(ValueError, match="no node of the Ray cluster"):
        check_feasible(dead_only, nodes)


def test_backend_choice():
    p = _placement({"g": {"nodes": ["x"]}})
    assert isinstance(make_backend("local", p), LocalBackend)
    with pytest.raises(ValueError, match="needs --placement-backend ray"):
        make_backend("local", p, "auto")
    with pytest.raises(ValueError, match="unknown placement backend"):
        make_backend("kubernetes", p)


def test_location_keys_combine_with_replicas():
    [group] = _placement({"enc": {"device": "cpu", "nodes": ["x"], "replicas": 2, "resources": {"enc_node": 1}}}).groups
    assert (group.replicas, dict(group.resources)) == (2, {"enc_node": 1.0})


def test_ray_backend_without_ray_is_a_one_line_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ValueError, match=r"needs Ray: pip install 'mstar-core\[ray\]'"):
        make_backend("ray", _placement({"g": {"nodes": ["x"]}}))
