"""``mstar models``: the installed model plugins, from package metadata only."""

from __future__ import annotations

import json
import sys

import click

from mstar.plugins.discovery import general_plugins, installed_models


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def models(as_json: bool) -> None:
    """List installed model plugins (imports no plugin, no torch)."""
    found = installed_models()
    if as_json:
        click.echo(json.dumps([m.as_dict() | {"api_problem": m.api_problem} for m in found], indent=2))
        return
    if not found:
        click.echo("No model plugins are installed (install a distribution that declares a "
                   "'mstar.models' entry point).")
        return

    from rich.console import Console
    from rich.table import Table

    table = Table("name", "distribution", "version", "aliases", "architectures", "plugin API")
    for m in found:
        api = ", ".join(m.plugin_api) or "undeclared"
        table.add_row(m.name, m.distribution, m.version, ", ".join(m.aliases),
                      ", ".join(m.architectures), api if m.api_problem is None else f"{api} (refused)")
    # Piped output must stay greppable: no wrapping at 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=400)
    console.print(table)
    extra = general_plugins()
    if extra:
        names = ", ".join(f"{p.name} ({p.distribution} {p.version})" for p in extra)
        console.print(f"general plugins: {names}", highlight=False, soft_wrap=True)
    # The line loading would fail with, once per distribution (a table cell is too narrow).
    problems = dict.fromkeys(p.api_problem for p in (*found, *extra) if p.api_problem)
    for problem in problems:
        console.print(f"refused: {problem}", highlight=False, soft_wrap=True, markup=False)
