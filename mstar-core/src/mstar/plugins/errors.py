"""Errors of plugin discovery and loading.

Each is raised with one line that names everything a user needs to fix it (the model, the
distribution, the entry point, the hook); the CLI prints it as is, without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PluginError(Exception):
    """Base of every discovery/loading error; ``str(err)`` is one user-facing line."""


class UnknownModelError(PluginError):
    """No installed model plugin has this name or alias."""


class UnknownArchitectureError(PluginError):
    """A checkpoint directory's ``config.json`` names no architecture a plugin serves."""


class AmbiguousArchitectureError(PluginError):
    """Several installed models serve a checkpoint directory's architecture."""


class DuplicateModelError(PluginError):
    """Two distributions claim one model name or alias."""


class PluginMetadataError(PluginError):
    """A distribution's entry-point metadata contradicts itself."""


class PluginApiVersionError(PluginError):
    """A plugin declares plugin API versions this core does not provide (or unreadable ones)."""


class PluginImportError(PluginError):
    """A plugin module raised while being imported."""


class HookSignatureError(PluginError):
    """A hookimpl names arguments its hook spec does not have."""


class UnknownHookError(PluginError):
    """A hookimpl implements a hook that no spec defines (usually a typo)."""


class MissingHookError(PluginError):
    """A model plugin lacks a required hook."""


class SpecMismatchError(PluginError):
    """The plugin's ``ModelSpec`` disagrees with its entry-point metadata."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (third-party messages often span several)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def quoted_list(items: Iterable[str]) -> str:
    names = sorted(items)
    return ", ".join(repr(n) for n in names) if names else "none"


class HookCallError(PluginError):
    """A hook raised (or returned the wrong type) while the plugin was being loaded."""


class StepSkippedError(PluginError):
    """A loading step could not run because an earlier one failed."""
