"""The plugin API version: what a distribution declares, what discovery refuses, and the
deprecated arguments that keep working for one minor version.

In-process tests use hand-written dist-info folders; the CLI tests run ``mstar`` on the
really installed fixtures of the ``api`` site (tests/fixtures/plugins: deprecated_arg,
future_api, bad_api)."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fake_dists import write_dist
from mstar.model.spec import ModelSpec
from mstar.plugins import api_version, deprecations
from mstar.plugins.api_version import PLUGIN_API_VERSION, PluginApiWarning, api_problem
from mstar.plugins.deprecations import PluginApiDeprecationWarning
from mstar.plugins.discovery import InstalledModel, InstalledPlugin, installed_models, resolve_model
from mstar.plugins.errors import PluginApiVersionError
from mstar.plugins.loading import ModelLoader
from plugin_asserts import assert_one_line_error, check_lines

FUTURE = "mstar-fixture-future-api"


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _spec_kwargs() -> dict:
    return {"load_config": dict, "build_graph": dict, "write_tiny_checkpoint": print}


# -- which versions run --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "provided", "fix"),
    [
        (("1.0",), "1.1", None),  # a later minor runs a plugin written for an earlier one
        (("1.1",), "1.1", None),
        (("1.1",), "1.9", None),
        (("0.9", "1.0"), "1.1", None),  # several entries: any one is enough
        (("1.2",), "1.1", "upgrade mstar-core to one that provides plugin API 1.2 or a later 1.x"),
        (("2.0",), "1.1", "upgrade mstar-core to one that provides plugin API 2.0 or a later 2.x"),
        (("1.3",), "2.0", "install a version of 'unit-x' made for plugin API 2.x"),
    ],
)
def test_which_declared_versions_a_core_runs(monkeypatch, declared, provided, fix):
    monkeypatch.setattr(api_version, "PLUGIN_API_VERSION", provided)
    problem = api_problem("unit-x", declared)
    if fix is None:
        assert problem is None
    else:
        assert problem is not None and problem.endswith(fix), problem
        assert f"but mstar-core provides plugin API {provided}" in problem


def test_plugin_api_version_is_major_minor_and_exported():
    import mstar

    assert mstar.PLUGIN_API_VERSION == PLUGIN_API_VERSION
    assert api_version.parse_api_version(PLUGIN_API_VERSION)


# -- discovery ---------------------------------------------------------------------------


def _dist(site: Path, name: str, model: str, api: dict[str, str] | None) -> None:
    eps = {"mstar.models": {model: f"{name.replace('-', '_')}.plugin"}}
    write_dist(site, name, eps | ({"mstar.plugin_api": api} if api is not None else {}))


def test_incompatible_declaration_is_refused_with_one_line_naming_both_versions(site):
    _dist(site, "unit-future", "futurelm", {"9.0": "unit_future"})
    _dist(site, "unit-fine", "finelm", {"1.0": "unit_fine"})
    # Listing still works (it reads metadata only); resolving the model refuses it.
    listed = {m.name: m for m in installed_models()}
    assert listed["futurelm"].plugin_api == ("9.0",) and listed["finelm"].api_problem is None
    with pytest.raises(PluginApiVersionError) as err:
        resolve_model("futurelm")
    assert str(err.value) == (
        "distribution 'unit-future' supports plugin API ~=9.0 (>=9.0,<10), but mstar-core "
        f"provides plugin API {PLUGIN_API_VERSION}: upgrade mstar-core to one that provides "
        "plugin API 9.0 or a later 9.x"
    )
    assert resolve_model("finelm").name == "finelm"  # the other plugin is unaffected


def test_unparsable_declaration_is_refused(site):
    _dist(site, "unit-odd", "oddlm", {"newest": "unit_odd"})
    with pytest.raises(PluginApiVersionError, match=r"^distribution 'unit-odd' declares plugin API 'newest' .*not a MAJOR\.MINOR version"):
        resolve_model("oddlm")


def test_undeclared_version_loads_with_a_warning_to_declare(site):
    _dist(site, "unit-old", "oldlm", None)
    with pytest.warns(PluginApiWarning, match=r"'unit-old' declares no plugin API version.*mstar\.plugin_api"):
        assert resolve_model("oldlm").plugin_api == ()


def test_undeclared_version_warns_once_per_process(site):
    _dist(site, "unit-old", "oldlm", None)
    code = "from mstar.plugins.discovery import resolve_model as r; r('oldlm'); r('oldlm')"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("declares no plugin API version") == 1, proc.stderr


def test_loader_refuses_an_incompatible_general_plugin_before_importing_anything():
    model = InstalledModel("m", "unit-m", "0.1", (), (), "unit_m.plugin", ("1.0",))
    general = InstalledPlugin("policy", "unit-policy", "0.1", "no_such_module", ("0.1",))
    with pytest.raises(PluginApiVersionError, match=r"^distribution 'unit-policy' supports plugin API ~=0\.1"):
        ModelLoader(model, [general])


# -- deprecated arguments ---------------------------------------------------------------


def test_removed_model_spec_argument_warns_at_the_callers_line_and_is_ignored(caplog):
    with pytest.warns(DeprecationWarning) as record:
        spec = ModelSpec(**_spec_kwargs(), max_model_len=lambda config: 64)
    (w,) = record
    assert w.category is PluginApiDeprecationWarning
    assert w.filename == __file__  # blamed on the plugin's call, not on core
    message = str(w.message)
    assert "ModelSpec(..., max_model_len=...) is deprecated since plugin API 1.1" in message
    assert "ARNodeSubmodule.max_model_len()" in message  # what to use instead
    assert spec == ModelSpec(**_spec_kwargs())
    assert dataclasses.is_dataclass(spec) and "max_model_len" not in {f.name for f in dataclasses.fields(spec)}


def test_deprecated_use_is_logged_once_per_call_site(caplog):
    caplog.set_level(logging.WARNING, logger="mstar.plugins.deprecations")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python's default for non-__main__ code
        for _ in range(3):
            ModelSpec(**_spec_kwargs(), max_model_len=None)
        ModelSpec(**_spec_kwargs(), max_model_len=None)  # another line: logged again
    lines = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert len(lines) == 2, lines
    assert all(line.startswith(f"{__file__}:") for line in lines)


def test_argument_is_an_error_once_its_minor_version_passed(monkeypatch):
    monkeypatch.setattr(api_version, "PLUGIN_API_VERSION", "1.2")
    with pytest.raises(TypeError, match=r"max_model_len=...\) was removed in plugin API 1\.2: drop it"):
        ModelSpec(**_spec_kwargs(), max_model_len=None)


def test_a_renamed_argument_is_one_table_line(monkeypatch):
    entry = deprecations.Deprecated("Box", "size", since="1.1", renamed_to="width", instead="pass width=")
    monkeypatch.setattr(deprecations, "DEPRECATED", (*deprecations.DEPRECATED, entry))

    @deprecations.accepts_deprecated_arguments
    @dataclasses.dataclass(frozen=True)
    class Box:
        width: int = 0

    with pytest.warns(DeprecationWarning, match=r"Box\(\.\.\., size=\.\.\.\) .*passed on as width="):
        assert Box(size=3) == Box(width=3)
    with pytest.raises(TypeError, match="both 'size' and its new name 'width'"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Box(size=3, width=4)


def test_removed_for_row_still_works_with_a_warning():
    import torch
    from mstar.model.submodule_base import BatchedModelOutput

    out = BatchedModelOutput({"a": torch.arange(3)}, {"r1": {"b": torch.ones(2)}})
    with pytest.warns(DeprecationWarning, match=r"for_row\(\) is deprecated.*by_request") as record:
        row = out.for_row(1, "r1")
    assert record[0].filename == __file__
    expected = out.by_request(["r0", "r1", "r2"])["r1"]
    assert row.keys() == expected.keys() and all(torch.equal(row[k], expected[k]) for k in row)


def _node_overriding_get_autocast_dtype():
    from mstar.model.submodule_base import NodeSubmodule

    class OldNode(NodeSubmodule):
        def prepare_inputs(self, graph_walk, info, signals): ...

        def forward_batched(self, graph_walk, engine_inputs, **kwargs): ...

        def get_autocast_dtype(self):  # API 1.0; core never called it
            return None

    return OldNode


def test_a_node_overriding_the_removed_get_autocast_dtype_is_reported_where_defined():
    with pytest.warns(DeprecationWarning, match=r"OldNode overrides NodeSubmodule\.get_autocast_dtype\(\), which is deprecated.*float32_nodes") as record:
        node_cls = _node_overriding_get_autocast_dtype()
    (w,) = record
    assert (w.filename, w.lineno) == (__file__, node_cls.get_autocast_dtype.__code__.co_firstlineno)
    with pytest.warns(DeprecationWarning, match=r"^NodeSubmodule\.get_autocast_dtype\(\) is deprecated"):
        assert super(node_cls, node_cls()).get_autocast_dtype() is None  # the base's shim


def test_overriding_a_removed_method_is_an_error_once_its_minor_version_passed(monkeypatch):
    monkeypatch.setattr(api_version, "PLUGIN_API_VERSION", "1.2")
    with pytest.raises(TypeError, match=r"OldNode overrides NodeSubmodule\.get_autocast_dtype\(\), which was removed in plugin API 1\.2"):
        _node_overriding_get_autocast_dtype()


def test_every_deprecated_argument_is_accepted_by_its_class():
    import mstar.model.spec  # noqa: F401  (decorates the classes)

    for entry in deprecations.DEPRECATED:
        assert api_version.supports(entry.since) or entry.since == PLUGIN_API_VERSION
        if entry.kind == "argument":
            assert entry.owner in deprecations.ACCEPTING, entry


# -- through the CLI, on really installed fixtures --------------------------------------


def test_plugin_with_a_deprecated_argument_passes_check_plugin_with_a_warning(run_mstar):
    proc = run_mstar("check-plugin", "deprecatedlm", sites=("api",))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(v.startswith("PASS") for v in check_lines(proc).values()), proc.stdout
    warned = [line for line in proc.stderr.splitlines() if "PluginApiDeprecationWarning" in line]
    assert len(warned) == 1, proc.stderr  # shown despite Python's filter, once
    assert "fixture_deprecated_arg/plugin.py:" in warned[0]
    assert "ModelSpec(..., max_model_len=...) is deprecated" in warned[0]
    assert "ARNodeSubmodule.max_model_len()" in warned[0]


@pytest.mark.parametrize("command", [
    ("check-plugin", "futureapilm"),
    ("serve", "--model", "futureapilm", "--random-weights", "--port", "1"),
])
def test_incompatible_plugin_fails_the_cli_with_one_line(run_mstar, command):
    proc = run_mstar(*command, sites=("api",))
    line = assert_one_line_error(proc, f"'{FUTURE}'", "~=9.0", f"plugin API {PLUGIN_API_VERSION}")
    assert line == f"Error: {api_problem(FUTURE, ('9.0',))}"


def test_unparsable_declaration_fails_the_cli_with_one_line(run_mstar):
    assert_one_line_error(
        run_mstar("check-plugin", "badapilm", sites=("api",)),
        "'mstar-fixture-bad-api'", "plugin API 'latest'", "not a MAJOR.MINOR version",
    )


def test_models_lists_refused_plugins_with_their_error(run_mstar):
    proc = run_mstar("models", sites=("api",))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("│")}
    assert rows["deprecatedlm"].split("│")[6].strip() == "1.0"
    assert rows["futureapilm"].split("│")[6].strip() == "9.0 (refused)"
    assert f"refused: {api_problem(FUTURE, ('9.0',))}" in proc.stdout
    assert "refused: distribution 'mstar-fixture-bad-api' declares plugin API 'latest'" in proc.stdout
