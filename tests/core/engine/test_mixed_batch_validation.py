"""A model's MixedBatchConfigs are checked against its graph when an engine is built: a
config that would merge nothing (unknown node or walk, a walk that never runs the node) is a
load-time error, before any weights load. Several configs, one per node, are how a model
declares mixed batches for several nodes (e.g. an LLM's prefill + decode and a talker's)."""

from __future__ import annotations

import pytest
from mstar.engine.builder import EngineConfig, build_core
from mstar.engine.mixed_batches import validate_mixed_batches
from mstar.graph import EngineKind, GraphSpec, LinearWalks, Loop, NodeSpec, Signal, Step, Walk
from mstar.model.spec import MixedBatchConfig
from mstar.plugins import hookimpl


@pytest.fixture(scope="module")
def toy_graph():
    from mstar_toy.config import DEFAULT_CONFIG
    from mstar_toy.plugin import build_graph

    return build_graph(DEFAULT_CONFIG)


def two_lm_graph() -> GraphSpec:
    """Two KV nodes, each with its own prefill and decode walks."""
    walks = {}
    for node in ("thinker", "talker"):
        walks[f"{node}_prefill"] = Walk(f"{node}_prefill", node, Step(node, ("ids",), ("tok",)))
        walks[f"{node}_decode"] = Walk(f"{node}_decode", node, Loop(f"{node}_loop", Step(node, ("tok",), ("tok",)), max_iters=4))
    return GraphSpec(
        nodes={n: NodeSpec(n, EngineKind.KV_CACHE) for n in ("thinker", "talker")},
        walks=walks,
        signals={"tok": Signal("tok", to_client=True)},
        state_machine=LinearWalks({"thinker": ("thinker_prefill", "thinker_decode"), "talker": ("talker_prefill", "talker_decode")}),
        request_inputs=("ids",),
    )


def test_one_config_per_node_is_accepted():
    configs = [
        MixedBatchConfig("thinker", ("thinker_prefill", "thinker_decode"), "thinker_mixed", {"thinker_prefill": 4}),
        MixedBatchConfig("talker", ("talker_prefill", "talker_decode"), "talker_mixed"),
    ]
    assert validate_mixed_batches(configs, two_lm_graph()) == configs


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (MixedBatchConfig("nope", ("prefill", "decode"), "mixed"), r"the graph has no node 'nope'"),
        (MixedBatchConfig("lm", ("prefill", "decod"), "mixed"), r"the graph has no walk 'decod'"),
        (MixedBatchConfig("lm", ("prefill",), "mixed"), r"needs at least two different walks"),
        (MixedBatchConfig("lm", ("prefill", "prefill"), "mixed"), r"needs at least two different walks"),
        (MixedBatchConfig("decoder", ("prefill", "decode"), "mixed"), r"walk 'prefill' never runs node 'decoder'"),
        (MixedBatchConfig("lm", ("prefill", "decode"), "mixed", {"decoder": 2}), r"max_rows \{'decoder': 2\} must name its walks"),
        (MixedBatchConfig("lm", ("prefill", "decode"), "mixed", {"prefill": 0}), r"max_rows \{'prefill': 0\}"),
    ],
)
def test_a_config_that_merges_nothing_is_refused(toy_graph, config, match):
    with pytest.raises(ValueError, match=match):
        validate_mixed_batches([config], toy_graph)


def test_a_walk_merged_twice_is_refused(toy_graph):
    configs = [MixedBatchConfig("lm", ("prefill", "decode"), "a"), MixedBatchConfig("lm", ("decode", "prefill"), "b")]
    with pytest.raises(ValueError, match=r"walk 'decode' of node 'lm' is already merged by 'a'"):
        validate_mixed_batches(configs, toy_graph)


def test_not_a_list_of_configs_is_refused(toy_graph):
    with pytest.raises(ValueError, match="must return a list of MixedBatchConfig"):
        validate_mixed_batches(MixedBatchConfig("lm", ("prefill", "decode"), "mixed"), toy_graph)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a MixedBatchConfig"):
        validate_mixed_batches([("lm", ("prefill", "decode"))], toy_graph)  # type: ignore[list-item]


def test_engine_build_fails_on_a_bad_config_before_building_nodes(toy_ckpt):
    from mstar.plugins.loading import load_model

    class Typo:
        @hookimpl(tryfirst=True)
        def mstar_mixed_batch_configs(self, model_name, config):
            return [MixedBatchConfig("lm", ("prefill", "deocde"), "mixed")]

        @hookimpl(tryfirst=True)
        def mstar_node_factories(self, config):
            raise AssertionError("node factories were asked for before the mixed-batch configs were checked")

    loaded = load_model("toy")
    loaded.pm.register(Typo())
    with pytest.raises(ValueError, match=r"MixedBatchConfig 'mixed' of node 'lm': the graph has no walk 'deocde'"):
        build_core(loaded, toy_ckpt, EngineConfig())
