"""Plugin-facing names taken out of the plugin API, still accepted for one minor version.

Policy: a removed or renamed argument (or method) keeps working in the plugin API version
that deprecates it (``since``), with a ``PluginApiDeprecationWarning`` that says what to use
instead; from the next minor version (``removed_in``) using it is a ``TypeError`` with the
same advice. Retiring a dataclass argument is one line in ``DEPRECATED``: classes decorated
with ``accepts_deprecated_arguments`` look their entries up there. A retired method is one
line there plus a shim that calls ``deprecated(owner, name).use(stacklevel=2)``; a plugin
class that still overrides a retired ``NodeSubmodule`` method is reported where it is defined.

Python hides a ``DeprecationWarning`` raised outside ``__main__``, and a plugin's code never
is ``__main__``, so each use is also logged once per call site (logger
``mstar.plugins.deprecations``): ``mstar check-plugin`` and ``mstar serve`` show it.
``-W error::DeprecationWarning`` still turns it into an error.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from mstar.plugins import api_version

log = logging.getLogger(__name__)

T = TypeVar("T", bound=type)


class PluginApiDeprecationWarning(DeprecationWarning):
    """A plugin uses a deprecated part of the plugin API."""


@dataclass(frozen=True)
class Deprecated:
    """A name of ``owner`` (a class) out of the API since plugin API ``since``."""

    owner: str
    name: str
    since: str
    instead: str  # what to use instead: the end of the message
    renamed_to: str | None = None  # a renamed argument: its value goes to this one
    kind: Literal["argument", "method"] = "argument"

    @property
    def removed_in(self) -> str:
        major, minor = api_version.parse_api_version(self.since)
        return f"{major}.{minor + 1}"

    @property
    def what(self) -> str:
        if self.kind == "method":
            return f"{self.owner}.{self.name}()"
        return f"{self.owner}(..., {self.name}=...)"

    def message(self, prefix: str = "") -> str:
        """What the warning (or, once removed, the error) says; ``prefix`` names who uses it."""
        head = f"{prefix}{self.what}, which" if prefix else self.what
        if self.removed():
            return f"{head} was removed in plugin API {self.removed_in}: {self.instead}"
        effect = {"method": "", "argument": f"passed on as {self.renamed_to}=; " if self.renamed_to else "ignored; "}
        return (
            f"{head} is deprecated since plugin API {self.since} "
            f"({effect[self.kind]}an error from {self.removed_in}): {self.instead}"
        )

    def removed(self) -> bool:
        provided = api_version.parse_api_version(api_version.PLUGIN_API_VERSION)
        return provided >= api_version.parse_api_version(self.removed_in)

    def use(self, stacklevel: int = 1) -> None:
        """Called where a plugin uses this name: warn, or raise once it is removed.
        ``stacklevel`` as for ``warnings.warn`` from the caller: 2 blames the caller's caller."""
        if self.removed():
            raise TypeError(self.message())
        frame = sys._getframe(stacklevel)
        warnings.warn(self.message(), PluginApiDeprecationWarning, stacklevel=stacklevel + 1)
        _log_once(self, frame.f_code.co_filename, frame.f_lineno)

    def overridden_by(self, cls: type) -> None:
        """``cls`` defines this retired method: warn at its ``def`` line, or raise once removed."""
        prefix = f"{cls.__module__}.{cls.__qualname__} overrides "
        if self.removed():
            raise TypeError(self.message(prefix))
        code = inspect.unwrap(vars(cls)[self.name]).__code__
        warnings.warn_explicit(
            self.message(prefix), PluginApiDeprecationWarning, code.co_filename, code.co_firstlineno,
            module=cls.__module__,
        )
        _log_once(self, code.co_filename, code.co_firstlineno, prefix)


# One line per retired plugin-facing name; keep entries until the next major version.
DEPRECATED: tuple[Deprecated, ...] = (
    Deprecated(
        "ModelSpec", "max_model_len", since="1.1",
        instead="drop it and give the limit in each KV node's ARNodeSubmodule.max_model_len(), "
        "the one the scheduler enforces (core never read this argument)",
    ),
    Deprecated(
        "BatchedModelOutput", "for_row", since="1.1", kind="method",
        instead="use outputs.by_request(request_ids)[request_id]",
    ),
    Deprecated(
        "mstar.layers", "load_safetensors", since="1.1", kind="method",
        instead="use mstar.weights.load_weights(module, checkpoint_dir, prefix=..., ignore=...) "
        "(the one loader: shards, renames, fused/split projections, cast on load)",
    ),
    Deprecated(
        "mstar.layers", "safetensors_keys", since="1.1", kind="method",
        instead="use mstar.weights.SafetensorsSource(checkpoint_dir).weight_map",
    ),
    Deprecated(
        "NodeSubmodule", "get_autocast_dtype", since="1.1", kind="method",
        instead="core never called it; it builds each node in the dtype it passes to the node's "
        "factory (dtype=), and a node that must stay float32 is listed in ModelSpec.float32_nodes",
    ),
)

ACCEPTING: set[str] = set()  # classes decorated with accepts_deprecated_arguments

_logged: set[tuple[str, str, str, int]] = set()


def deprecated(owner: str, name: str) -> Deprecated:
    """The ``DEPRECATED`` entry of ``owner.name``."""
    return next(d for d in DEPRECATED if (d.owner, d.name) == (owner, name))


def _log_once(entry: Deprecated, filename: str, lineno: int, prefix: str = "") -> None:
    key = (entry.owner, entry.name, filename, lineno)
    if key in _logged:
        return
    _logged.add(key)
    log.warning("%s:%d: %s: %s", filename, lineno, PluginApiDeprecationWarning.__name__, entry.message(prefix))


def warn_overridden(cls: type, owner: str) -> None:
    """From ``owner.__init_subclass__``: warn, at its ``def`` line, for each retired method
    of ``owner`` that ``cls`` still defines (core no longer calls it)."""
    for entry in DEPRECATED:
        if entry.owner == owner and entry.kind == "method" and entry.name in vars(cls):
            entry.overridden_by(cls)


def accepts_deprecated_arguments(cls: T) -> T:
    """Class decorator (over ``@dataclass``): ``cls(...)`` also takes the ``DEPRECATED``
    arguments of ``cls``, warning at the caller's line; a renamed one's value is passed on
    under its new name, a removed one's is dropped."""
    ACCEPTING.add(cls.__name__)
    table = {d.name: d for d in DEPRECATED if d.owner == cls.__name__ and d.kind == "argument"}
    if not table:
        return cls
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in table.keys() & kwargs.keys():
            entry = table[name]
            value = kwargs.pop(name)
            entry.use(stacklevel=2)  # the plugin's cls(...) call
            if entry.renamed_to is not None:
                if entry.renamed_to in kwargs:
                    raise TypeError(f"{cls.__name__}() got both {name!r} and its new name {entry.renamed_to!r}")
                kwargs[entry.renamed_to] = value
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
