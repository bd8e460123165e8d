"""The conformance kit as a Python API: custom checks, skipping after a failed prerequisite."""

from __future__ import annotations

import pytest
from mstar.testing.conformance import (
    CHECKS,
    Check,
    CheckFailed,
    assert_conformant,
    run_conformance,
)


@pytest.fixture
def models_site(plugin_sites, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_sites["models"]))


def test_an_appended_check_sees_the_loaded_plugin_and_graph(models_site):
    seen = {}

    def walks_known(ctx):
        seen["walks"] = sorted(ctx.graph.walks)
        return "ok"

    report = run_conformance("fixturelm", checks=[*CHECKS, Check("walks known", walks_known)])
    assert report.ok, report.results
    assert report.results[-1].name == "walks known" and report.results[-1].detail == "ok"
    assert seen["walks"] == ["decode", "prefill"]


def test_a_failed_prerequisite_is_reported_once_then_skipped(models_site):
    def no_config():
        raise CheckFailed("no config")

    def broken_config(ctx):
        ctx.once("tiny config", no_config)

    def needs_config(ctx):
        return str(ctx.config)

    report = run_conformance(
        "fixturelm", checks=[Check("config", broken_config), Check("uses config", needs_config)]
    )
    assert [(r.name, r.status) for r in report.results] == [("config", "fail"), ("uses config", "skip")]
    assert report.results[0].detail == "no config"


def test_assert_conformant_lists_the_failures(models_site):
    assert_conformant("fixturelm")
    with pytest.raises(AssertionError, match="FAIL required hooks: .*'mstar_node_samplers'"):
        assert_conformant("nohooklm")
