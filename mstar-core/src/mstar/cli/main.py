"""The ``mstar`` command.

Each subcommand lives in its own module, listed in ``SUBCOMMANDS`` and imported only when
it runs (or for ``--help``): ``mstar models`` must not pay for the server's imports. To add
one, write ``mstar/cli/<name>.py`` with a click command and add it to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import importlib

import click

from mstar import __version__
from mstar.plugins.errors import PluginError

SUBCOMMANDS: dict[str, str] = {
    "models": "mstar.cli.models:models",
    "check-plugin": "mstar.cli.check_plugin:check_plugin",
    "serve": "mstar.cli.serve:serve",
    "bench": "mstar.cli.bench:bench",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module on first use; turns ``PluginError`` into one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in SUBCOMMANDS:
            module, attr = SUBCOMMANDS[cmd_name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PluginError as exc:
            if ctx.params.get("traceback"):
                raise
            # Errors a user can fix are one line on stderr, exit 1, no traceback.
            raise click.ClickException(" ".join(str(exc).split())) from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mstar")
@click.option("--traceback", is_flag=True, help="Show the full traceback of plugin errors.")
def main(traceback: bool) -> None:
    """M*: serve composite multimodal models from installed plugins."""


if __name__ == "__main__":
    main(prog_name="mstar")
