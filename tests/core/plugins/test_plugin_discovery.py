"""Discovery rules on hand-written dist-info folders (in-process: nothing is imported)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_dists import write_dist
from mstar.plugins.discovery import installed_models, resolve_model
from mstar.plugins.errors import (
    AmbiguousArchitectureError,
    DuplicateModelError,
    PluginMetadataError,
    UnknownModelError,
)


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _mine(models):
    return [m for m in models if m.distribution.startswith("unit-")]


def test_aliases_and_architectures_attach_to_their_model(site):
    write_dist(site, "unit-two", {
        "mstar.models": {"alpha": "unit_two.alpha", "beta": "unit_two.beta:plugin"},
        "mstar.model_aliases": {"a-1": "alpha", "a-2": "alpha"},
        "mstar.model_architectures": {"BetaForCausalLM": "beta"},
    })
    alpha, beta = _mine(installed_models())
    assert (alpha.name, alpha.aliases, alpha.architectures) == ("alpha", ("a-1", "a-2"), ())
    assert (beta.entry_point, beta.architectures) == ("unit_two.beta:plugin", ("BetaForCausalLM",))
    assert resolve_model("a-2") is not None and resolve_model("a-2").name == "alpha"


def test_alias_for_a_model_the_distribution_does_not_provide(site):
    write_dist(site, "unit-bad", {
        "mstar.models": {"alpha": "unit_bad.plugin"},
        "mstar.model_aliases": {"al": "alhpa"},
    })
    with pytest.raises(PluginMetadataError, match=r"'unit-bad'.*'alhpa'.*'alpha'"):
        installed_models()


def test_alias_equal_to_another_distributions_model_name(site):
    write_dist(site, "unit-a", {"mstar.models": {"alpha": "unit_a.plugin"}})
    write_dist(site, "unit-b", {
        "mstar.models": {"beta": "unit_b.plugin"},
        "mstar.model_aliases": {"alpha": "beta"},
    })
    with pytest.raises(DuplicateModelError, match=r"'alpha'.*'unit-a'.*'unit-b'"):
        installed_models()


def test_one_distribution_twice_on_the_path_is_not_a_duplicate(site, tmp_path_factory, monkeypatch):
    other = tmp_path_factory.mktemp("second-site")
    for s in (site, other):
        write_dist(s, "unit-a", {"mstar.models": {"alpha": "unit_a.plugin"}})
    monkeypatch.syspath_prepend(str(other))
    assert [m.name for m in _mine(installed_models())] == ["alpha"]


def test_checkpoint_architecture_served_by_two_models(site, tmp_path_factory):
    for dist, model in (("unit-a", "alpha"), ("unit-b", "beta")):
        write_dist(site, dist, {
            "mstar.models": {model: f"{dist.replace('-', '_')}.plugin"},
            "mstar.model_architectures": {"SharedForCausalLM": model},
        })
    ckpt = tmp_path_factory.mktemp("ckpt")
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["SharedForCausalLM"]}))
    with pytest.raises(AmbiguousArchitectureError, match=r"'alpha' \(unit-a\).*'beta' \(unit-b\)"):
        resolve_model(ckpt)


def test_unknown_name_that_is_neither_model_nor_directory(site):
    write_dist(site, "unit-a", {"mstar.models": {"alpha": "unit_a.plugin"}})
    with pytest.raises(UnknownModelError, match=r"did you mean 'alpha'\?"):
        resolve_model("alpah")
