"""The plugin API's version, and whether an installed plugin was written for it.

``PLUGIN_API_VERSION`` is ``MAJOR.MINOR``. A minor version only adds to the API or
deprecates part of it (a deprecated name keeps working for one minor version, see
``mstar.plugins.deprecations``); a major version may break plugins.

A distribution declares the API version(s) it is written against as entry-point *names* in
group ``mstar.plugin_api`` (setuptools accepts no version specifier as an entry-point value,
and ``=`` in no name, so the name is a bare version; the value names the plugin's package
and is never imported)::

    [project.entry-points."mstar.plugin_api"]
    "1.1" = "mstar_mymodel"

Each entry ``"X.Y"`` means the range ``~=X.Y`` (``>=X.Y, <X+1``): written against X.Y, the
plugin runs on X.Y and on every later X minor. Several entries add up (``"1.3"`` and
``"2.0"``: 1.3 up to 3). A distribution that declares nothing is loaded with a warning.
"""

from __future__ import annotations

import re
import warnings

from mstar.plugins.errors import PluginApiVersionError

PLUGIN_API_VERSION = "1.1"
PLUGIN_API_GROUP = "mstar.plugin_api"

_VERSION = re.compile(r"(\d+)\.(\d+)")


class PluginApiWarning(UserWarning):
    """A plugin distribution declares no plugin API version (it is loaded anyway)."""


def parse_api_version(text: str) -> tuple[int, int]:
    """``"1.1"`` -> ``(1, 1)``; ``ValueError`` for anything that is not ``MAJOR.MINOR``."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a MAJOR.MINOR plugin API version")
    return int(match.group(1)), int(match.group(2))


def supports(declared: str, provided: str | None = None) -> bool:
    """Whether API ``provided`` (default: this core's) runs a plugin written against
    ``declared``, i.e. ``provided`` is in ``~=declared``."""
    have_major, have_minor = parse_api_version(provided or PLUGIN_API_VERSION)
    major, minor = parse_api_version(declared)
    return have_major == major and have_minor >= minor


def describe_range(declared: tuple[str, ...]) -> str:
    """``("1.1",)`` -> ``"~=1.1 (>=1.1,<2)"``; entries are joined with ``or``."""
    parts = []
    for text in declared:
        major, minor = parse_api_version(text)
        parts.append(f"~={major}.{minor} (>={major}.{minor},<{major + 1})")
    return " or ".join(parts)


def api_problem(distribution: str, declared: tuple[str, ...]) -> str | None:
    """The one-line reason ``distribution`` cannot run on this core's plugin API, or None.

    ``declared`` are its ``mstar.plugin_api`` entry-point names (empty: none declared).
    """
    if not declared:
        return None
    for text in declared:
        try:
            parse_api_version(text)
        except ValueError:
            return (
                f"distribution {distribution!r} declares plugin API {text!r} in its "
                f"{PLUGIN_API_GROUP} entry points, which is not a MAJOR.MINOR version; declare the "
                f'version it is written against as the entry point\'s name, e.g. "{PLUGIN_API_VERSION}" = "<package>"'
            )
    if any(supports(text) for text in declared):
        return None
    have = parse_api_version(PLUGIN_API_VERSION)
    newer = sorted(parse_api_version(t) for t in declared if parse_api_version(t) > have)
    if newer:
        (major, minor), *_ = newer
        fix = f"upgrade mstar-core to one that provides plugin API {major}.{minor} or a later {major}.x"
    else:
        fix = f"install a version of {distribution!r} made for plugin API {have[0]}.x"
    return (
        f"distribution {distribution!r} supports plugin API {describe_range(declared)}, "
        f"but mstar-core provides plugin API {PLUGIN_API_VERSION}: {fix}"
    )


def require_supported(distribution: str, declared: tuple[str, ...]) -> None:
    """Raise ``PluginApiVersionError`` when ``distribution`` cannot run on this plugin API;
    warn once (per distribution and process) when it declares no version."""
    problem = api_problem(distribution, declared)
    if problem is not None:
        raise PluginApiVersionError(problem)
    if not declared:
        # stacklevel 1 on purpose: the warnings registry then shows each text once.
        warnings.warn(
            f"distribution {distribution!r} declares no plugin API version; it is loaded as "
            f"if written for plugin API {PLUGIN_API_VERSION}. Declare the version it is written "
            f'against: [project.entry-points."{PLUGIN_API_GROUP}"] "{PLUGIN_API_VERSION}" = "<package>"',
            PluginApiWarning,
            stacklevel=1,
        )
