"""The plugin docs stay true to the code: docs/reference.md documents every hook, every field
of the plugin-facing dataclasses and engine options, and every conformance check, and
docs/writing-a-plugin.md lists exactly the checks ``mstar check-plugin`` runs and quotes only
code that exists."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from mstar.api.adapter import ApiAdapter
from mstar.api.protocol import GenerateRequest
from mstar.engine.builder import EngineConfig
from mstar.model import submodule_base as sb
from mstar.model.spec import MixedBatchConfig, ModelSpec, NodeSamplers, PiecewiseGraphConfig
from mstar.plugins import hookspecs
from mstar.sampling import SamplingParams
from mstar.testing.conformance import CHECKS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
GUIDE = ROOT / "docs" / "writing-a-plugin.md"


def section(doc: str, heading: str) -> str:
    """The text under ``## heading`` (or ``### heading``) up to the next heading of that level."""
    level = "###" if heading.startswith("### ") else "##"
    title = heading.removeprefix("### ")
    match = re.search(rf"^{level} {re.escape(title)}\n(.*?)(?=^{level} |\Z)", doc, re.M | re.S)
    assert match, f"no section {heading!r}"
    return match.group(1)


def table_rows(text: str) -> dict[str, str]:
    """First-column name (the backticked identifier, arguments dropped) → the whole row."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([A-Za-z_]\w*)", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} listed twice"
            rows[m.group(1)] = line
    return rows


def ticked(text: str) -> set[str]:
    """Every identifier that appears inside backticks, alone or as part of a dotted name or call."""
    names: set[str] = set()
    fenced = re.compile(r"^```.*?^```", re.M | re.S)
    for code in fenced.findall(text) + re.findall(r"`([^`]+)`", fenced.sub("", text)):
        names.update(re.findall(r"[A-Za-z_]\w*", code.strip("`")))
    return names


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def numbered_checks(text: str) -> list[str]:
    return re.findall(r"^\d+\. `([^`]+)`", text, re.M)


@pytest.fixture(scope="module")
def reference() -> str:
    return REFERENCE.read_text()


def hook_specs() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    }


def test_every_hook_is_documented_with_its_arguments(reference: str) -> None:
    text = section(reference, "Hooks")
    rows = table_rows(text)
    specs = hook_specs()
    assert set(rows) == set(specs)
    for name, sig in specs.items():
        documented = re.match(rf"\| `{name}\(([^)]*)\)`", rows[name])
        assert documented, f"{name}: write its arguments as `{name}(...)`"
        args = [a.strip() for a in documented.group(1).split(",") if a.strip()]
        assert args == list(sig.parameters), name
        required = name in hookspecs.REQUIRED_MODEL_HOOKS
        assert rows[name].split("|")[2].strip() == ("yes" if required else "no"), name


@pytest.mark.parametrize("cls", [ModelSpec, NodeSamplers, MixedBatchConfig, PiecewiseGraphConfig], ids=lambda c: c.__name__)
def test_every_spec_field_is_documented(reference: str, cls: type) -> None:
    assert set(table_rows(section(reference, cls.__name__))) == field_names(cls)


def test_every_engine_option_is_documented_with_its_default(reference: str) -> None:
    rows = table_rows(section(reference, "Engine options"))
    assert set(rows) == field_names(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        default = rows[f.name].split("|")[2].strip()
        assert default == f"`{f.default!r}`", f"{f.name}: the table says {default}, the code {f.default!r}"


def test_reference_lists_the_conformance_checks_in_order(reference: str) -> None:
    assert numbered_checks(section(reference, "Conformance checks")) == [c.name for c in CHECKS]


def test_guide_lists_exactly_the_checks_check_plugin_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner
    from mstar.cli.check_plugin import check_plugin
    from mstar.testing import conformance
    from mstar.testing.conformance import Check

    listed = numbered_checks(section(GUIDE.read_text(), "Conformance checks"))
    assert listed == [c.name for c in CHECKS]
    # What the command itself reports, on the installed example plugin, with every check's
    # work replaced by a pass (the names and their order are the command's own).
    monkeypatch.setattr(conformance, "CHECKS", [Check(c.name, lambda ctx: None) for c in CHECKS])
    result = CliRunner().invoke(check_plugin, ["toy", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["check"] for r in json.loads(result.output)["results"]] == listed


def _public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


def test_submodule_contract_is_documented(reference: str) -> None:
    names = ticked(section(reference, "Submodule contract"))
    wanted = _public_methods(sb.NodeSubmodule) | _public_methods(sb.ARNodeSubmodule) | {"last_token_index", "STOP_ALL"}
    for cls in (sb.NodeInputs, sb.ARNodeInputs, sb.CurrentForwardPassInfo, sb.ModelInputsFromEngine,
                sb.PerRequestState, sb.BatchedModelOutput, sb.KVCacheLayout):
        wanted |= field_names(cls) | {cls.__name__}
    for cls in (sb.StopCheck, sb.BatchedStopCheck):
        wanted |= set(cls._fields) | {cls.__name__}
    assert not wanted - names, f"undocumented: {sorted(wanted - names)}"


def test_api_adapter_surface_is_documented(reference: str) -> None:
    names = ticked(section(reference, "ApiAdapter"))
    public = {n for n in vars(ApiAdapter) if not n.startswith("_")}
    assert not public - names, f"undocumented: {sorted(public - names)}"


def test_generate_request_fields_are_documented(reference: str) -> None:
    rows = table_rows(section(reference, "/v1/generate"))
    assert set(rows) == set(GenerateRequest.model_fields)


def test_sampling_params_and_batch_sampler_are_documented(reference: str) -> None:
    from mstar.sampling import BatchSampler

    names = ticked(section(reference, "Sampling"))
    public = {n for n in vars(BatchSampler) if not n.startswith("_")} | {"last_main_tokens"}
    missing = (set(SamplingParams.model_fields) | public) - names
    assert not missing, f"undocumented: {sorted(missing)}"


def test_attention_backend_calls_are_documented(reference: str) -> None:
    from mstar.attention.backend import AttentionBackend
    from mstar.attention.selection import BACKEND_NAMES

    text = section(reference, "Attention backends")
    names = ticked(text)
    assert {"plan", "run"} <= _public_methods(AttentionBackend) <= names
    assert list(inspect.signature(AttentionBackend.run).parameters) == ["self", "layer", "q", "k", "v", "scale", "window"]
    assert "run(layer, q, k, v, scale=None, window=None)" in text
    assert set(BACKEND_NAMES) <= names


def test_weight_loader_is_documented(reference: str) -> None:
    import mstar.weights
    from mstar.testing.sharding import shard_checkpoint

    rows = table_rows(section(reference, "Weights (`mstar.weights`)"))
    arguments = [p.name for p in inspect.signature(mstar.weights.load_weights).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert set(rows) == set(mstar.weights.__all__) | set(arguments) | {shard_checkpoint.__name__}
    documented = re.match(r"\| `load_weights\(([^)]*)\)`", rows["load_weights"])
    assert documented and [a.strip(" *") for a in documented.group(1).split(",") if a.strip(" *")] == [
        *list(inspect.signature(mstar.weights.load_weights).parameters)]


def quoted_blocks(doc: str) -> list[tuple[str, list[str]]]:
    """Code blocks whose first line is a comment naming a repository file: (path, other lines)."""
    out = []
    for body in re.findall(r"^```\w*\n(.*?)^```", doc, re.M | re.S):
        first, *rest = body.splitlines()
        m = re.fullmatch(r"(?:#|//) ((?:tests|examples|mstar-core)/\S+)", first.strip())
        if m:
            out.append((m.group(1), rest))
    return out


def test_guide_quotes_only_real_code() -> None:
    blocks = quoted_blocks(GUIDE.read_text())
    assert len(blocks) >= 5, "the guide's snippets name their source files"
    for path, lines in blocks:
        source = (ROOT / path).read_text()
        have = {line.strip() for line in source.splitlines()}
        for line in lines:
            if line.strip() and line.strip() != "...":
                assert line.strip() in have, f"{path} has no line {line.strip()!r}"


SYSTEM = ROOT / "docs" / "plugin-system.md"


def test_plugin_system_lists_the_load_steps_and_errors() -> None:
    from mstar.plugins import errors
    from mstar.plugins.loading import LOAD_STEPS

    doc = SYSTEM.read_text()
    steps = re.findall(r"^\| ([a-z][a-z ]+[a-z]) \|", section(doc, "Loading (`mstar.plugins.loading`)"), re.M)
    assert steps[1:] == list(LOAD_STEPS)  # after the header row
    classes = {n for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.PluginError) and c is not errors.PluginError}
    missing = classes - ticked(section(doc, "Errors (`mstar.plugins.errors`)"))
    assert not missing, f"undocumented: {sorted(missing)}"


def test_plugin_api_names_and_changelog_are_documented(reference: str) -> None:
    from mstar.plugins import api_version, deprecations

    names = ticked(section(reference, "Plugin API version"))
    public = {
        n for module in (api_version, deprecations) for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", module.__name__) == module.__name__
        and not inspect.ismodule(v) and n not in {"annotations", "log", "T"}
    }
    assert not public - names, f"undocumented: {sorted(public - names)}"
    system = SYSTEM.read_text()
    changelog = section(system, "### Changelog of the plugin API").split("\n## ")[0]
    assert f"**{api_version.PLUGIN_API_VERSION}**" in changelog, "no changelog entry for the current version"
    for entry in deprecations.DEPRECATED:
        assert f"{entry.owner}.{entry.name}" in changelog or f"{entry.owner}({entry.name}=" in changelog, entry
    assert "PluginApiVersionError" in ticked(section(system, "Errors (`mstar.plugins.errors`)"))
