"""The conformance kit: checks a model plugin end to end, before it ever serves.

``run_conformance(name)`` runs every check of ``CHECKS`` in order and returns one
``CheckResult`` per check; ``mstar check-plugin`` prints them, and a model's own tests call
``assert_conformant(name)``. A check is a ``Check(name, fn)`` where ``fn(ctx)`` raises on
failure (any exception: its message becomes the failure line) and may return a short detail
string. Add a check by appending to ``CHECKS`` (or passing ``checks=``)::

    CHECKS.append(Check("walks run once", run_every_walk_once))

Checks share work through the ``ConformanceContext``: the loaded plugin, the tiny
checkpoint, its config and graph are computed once. When one of those fails, the check that
hit it first reports the failure and later checks that need it are *skipped*, so a report
names the root cause once.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar.plugins.discovery import InstalledModel, resolve_model
from mstar.plugins.errors import PluginError, StepSkippedError, one_line
from mstar.plugins.loading import LOAD_STEPS
from mstar.testing import run_checks as rc
from mstar.testing.check_context import (
    Check,
    CheckFailed,
    CheckResult,
    CheckSkipped,
    ConformanceContext,
)


@dataclass(frozen=True)
class ConformanceReport:
    model: InstalledModel
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")


def run_conformance(
    target: str | Path, checks: Iterable[Check] | None = None
) -> ConformanceReport:
    """Run ``checks`` (default: ``CHECKS``) on the model named by ``target``.

    Errors that stop before any check can run (unknown model, duplicate names) raise
    ``PluginError``.
    """
    installed = resolve_model(target)
    with tempfile.TemporaryDirectory(prefix="mstar-conformance-") as tmp:
        ctx = ConformanceContext(installed, Path(tmp))
        results = tuple(run_check(c, ctx) for c in (CHECKS if checks is None else checks))
    return ConformanceReport(installed, results)


def run_check(check: Check, ctx: ConformanceContext) -> CheckResult:
    try:
        detail = check.fn(ctx) or ""
    except (CheckSkipped, StepSkippedError) as exc:
        return CheckResult(check.name, "skip", str(exc))
    except (CheckFailed, PluginError) as exc:
        return CheckResult(check.name, "fail", " ".join(str(exc).split()))
    except Exception as exc:
        return CheckResult(check.name, "fail", one_line(exc))
    return CheckResult(check.name, "pass", detail)


def assert_conformant(target: str | Path, checks: Iterable[Check] | None = None) -> None:
    """For a model's own tests: raise AssertionError listing every failed check."""
    report = run_conformance(target, checks)
    if not report.ok:
        lines = [f"{r.status.upper()} {r.name}: {r.detail}" for r in report.results if not r.ok]
        raise AssertionError(f"{report.model.name} is not conformant:\n" + "\n".join(lines))


# -- the static checks ---------------------------------------------------------------------


def _load_step(step: str) -> Callable[[ConformanceContext], None]:
    def run(ctx: ConformanceContext) -> None:
        ctx.loader.run_until(step)

    return run


def check_shipped_files(ctx: ConformanceContext) -> str:
    spec = ctx.loaded.spec
    base = _plugin_dir(ctx.loaded.plugin)
    paths = [Path(f) if Path(f).is_absolute() or base is None else base / f for f in spec.shipped_files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CheckFailed(f"ModelSpec.shipped_files names missing file(s): {', '.join(missing)}")
    return f"{len(paths)} file(s)"


def check_tiny_checkpoint(ctx: ConformanceContext) -> str:
    config = ctx.config
    if not isinstance(config, Mapping):
        raise CheckFailed(f"load_config() returned {type(config).__name__}, expected a dict")
    return f"written and read back ({len(config)} config keys)"


def check_graph(ctx: ConformanceContext) -> str:
    from mstar.graph import GraphSpec

    graph = ctx.graph
    if not isinstance(graph, GraphSpec):
        raise CheckFailed(f"build_graph() returned {type(graph).__name__}, expected a GraphSpec")
    graph.validate()
    return f"{len(graph.nodes)} node(s), {len(graph.walks)} walk(s)"


def check_node_factories(ctx: ConformanceContext) -> str:
    factories = ctx.loaded.hook.mstar_node_factories(config=ctx.config)
    if not isinstance(factories, Mapping):
        raise CheckFailed(f"mstar_node_factories returned {type(factories).__name__}, expected a dict")
    nodes = set(ctx.graph.nodes)
    _require_same_keys("mstar_node_factories", set(factories), nodes)
    not_callable = sorted(n for n, f in factories.items() if not callable(f))
    if not_callable:
        raise CheckFailed(f"mstar_node_factories: factories of {not_callable} are not callable")
    return f"covers {sorted(nodes)}"


def check_node_samplers(ctx: ConformanceContext) -> str:
    from mstar.model.spec import NodeSamplers

    samplers = _samplers(ctx)
    unknown = sorted(set(samplers) - set(ctx.graph.nodes))
    if unknown:
        raise CheckFailed(
            f"mstar_node_samplers names node(s) {unknown} that are not in the graph "
            f"(nodes: {sorted(ctx.graph.nodes)})"
        )
    wrong = sorted(n for n, s in samplers.items() if not isinstance(s, NodeSamplers))
    if wrong:
        raise CheckFailed(f"mstar_node_samplers: entries of {wrong} are not NodeSamplers")
    return f"nodes {sorted(samplers)}" if samplers else "no sampling node"


def check_sampler_labels_static(ctx: ConformanceContext) -> str:
    # The engine builds each node's sampler (a MultiSampler, one SlotSampler per label) once at
    # start-up (mstar/engine/builder.py): a label set that varies would leave later labels
    # silently unserved.
    first = _label_sets(_samplers(ctx))
    for call in (2, 3):
        again = _label_sets(ctx.loaded.hook.mstar_node_samplers(config=ctx.config))
        if again != first:
            raise CheckFailed(
                f"mstar_node_samplers returned a different label set on call {call}: "
                f"{_fmt_labels(first)} then {_fmt_labels(again)}; the label set must be static "
                "(only values may vary per request)"
            )
    return _fmt_labels(first)


def _samplers(ctx: ConformanceContext) -> Mapping[str, Any]:
    def call() -> Mapping[str, Any]:
        samplers = ctx.loaded.hook.mstar_node_samplers(config=ctx.config)
        if not isinstance(samplers, Mapping):
            raise CheckFailed(
                f"mstar_node_samplers returned {type(samplers).__name__}, expected a dict"
            )
        return samplers

    return ctx.once("node samplers", call)


def _label_sets(samplers: Any) -> dict[str, frozenset[str]]:
    if not isinstance(samplers, Mapping):
        return {"<not a dict>": frozenset()}
    return {node: frozenset(getattr(s, "aux", {}) or {}) for node, s in samplers.items()}


def _fmt_labels(sets: Mapping[str, frozenset[str]]) -> str:
    return "; ".join(f"{node}: {sorted(labels)}" for node, labels in sorted(sets.items())) or "{}"


def _require_same_keys(what: str, got: set[str], want: set[str]) -> None:
    missing, extra = sorted(want - got), sorted(got - want)
    if missing or extra:
        parts = [f"missing graph node(s) {missing}" if missing else "",
                 f"unknown node(s) {extra}" if extra else ""]
        raise CheckFailed(f"{what}: " + ", ".join(p for p in parts if p))


def _plugin_dir(plugin: object) -> Path | None:
    """Where relative ``shipped_files`` are looked up: the plugin module's folder."""
    module = plugin if inspect.ismodule(plugin) else sys.modules.get(type(plugin).__module__)
    file = getattr(module, "__file__", None)
    return Path(file).parent if file else None


STATIC_CHECKS: tuple[Check, ...] = (
    *(Check(step, _load_step(step)) for step in LOAD_STEPS),
    Check("shipped files exist", check_shipped_files),
    Check("tiny checkpoint loads", check_tiny_checkpoint),
    Check("graph validates", check_graph),
    Check("node factories cover the graph", check_node_factories),
    Check("node samplers name graph nodes", check_node_samplers),
    Check("sampler labels are static", check_sampler_labels_static),
)



RUN_CHECKS: tuple[Check, ...] = (
    Check("piecewise configs match the runner", rc.check_piecewise_conventions),
    Check("every walk runs once on the tiny checkpoint", rc.check_every_walk_runs),
    Check("seeded requests reproduce", rc.check_seeds_reproduce),
    Check("stop rules apply (max_tokens, stop ids)", rc.check_stop_rules),
)
"""Checks that build the nodes and run requests through the real engine."""

CHECKS: list[Check] = [*STATIC_CHECKS, *RUN_CHECKS]
"""The checks ``mstar check-plugin`` runs, in order."""

__all__ = [
    "CHECKS",
    "RUN_CHECKS",
    "STATIC_CHECKS",
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "ConformanceContext",
    "ConformanceReport",
    "assert_conformant",
    "run_check",
    "run_conformance",
]
