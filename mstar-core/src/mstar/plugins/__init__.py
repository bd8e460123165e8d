"""The plugin system: hook specifications, markers, discovery and loading."""

from mstar.plugins.api_version import PLUGIN_API_VERSION
from mstar.plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec

__all__ = ["PLUGIN_API_VERSION", "PROJECT_NAME", "hookimpl", "hookspec"]
