"""``mstar check-plugin NAME``: load a model plugin and run the conformance checks."""

from __future__ import annotations

import json

import click

_MARKS = {"pass": ("PASS", "green"), "fail": ("FAIL", "red"), "skip": ("SKIP", "yellow")}


@click.command("check-plugin")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--static-only", is_flag=True, help="Skip the checks that build and run the model.")
def check_plugin(name: str, as_json: bool, static_only: bool) -> None:
    """Check model plugin NAME (a name, an alias or a checkpoint directory).

    Prints one line per check; exits 1 when any check fails.
    """
    from mstar.testing.conformance import STATIC_CHECKS, run_conformance

    report = run_conformance(name, STATIC_CHECKS if static_only else None)
    if as_json:
        results = [{"check": r.name, "status": r.status, "detail": r.detail} for r in report.results]
        click.echo(json.dumps({"model": report.model.name, "ok": report.ok, "results": results}, indent=2))
    else:
        click.echo(f"{report.model.name} ({report.model.distribution} {report.model.version})")
        for r in report.results:
            word, color = _MARKS[r.status]
            detail = f": {r.detail}" if r.detail else ""
            click.echo(f"{click.style(word, fg=color)}  {r.name}{detail}")
    if not report.ok:
        # The first failure is usually the root cause (later checks are skipped after it).
        first, *others = report.failures
        more = f" (and {len(others)} more failed check(s))" if others else ""
        raise click.ClickException(f"{report.model.name}: {first.name}: {first.detail}{more}")
    if not as_json:
        click.echo(f"{report.model.name}: all {len(report.results)} checks passed")
