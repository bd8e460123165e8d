"""The plugin system: hook specifications, markers, discovery and loading."""

from mstar.plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]
