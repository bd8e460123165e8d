"""Loading exactly one model plugin (plus the general plugins) into a plugin manager.

Loading is a short list of named steps so that ``mstar check-plugin`` can report each one;
``load_model`` runs them all and raises the first failure as a one-line ``PluginError``.
Every mistake a plugin can make in its hook surface fails here, at load time, never later
in the middle of serving.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from mstar.model.spec import ModelSpec
from mstar.plugins import hookspecs
from mstar.plugins.api_version import require_supported
from mstar.plugins.discovery import (
    ALIASES_GROUP,
    ARCHITECTURES_GROUP,
    GENERAL_PLUGINS_GROUP,
    MODELS_GROUP,
    InstalledModel,
    InstalledPlugin,
    general_plugins,
    resolve_model,
)
from mstar.plugins.errors import (
    HookCallError,
    HookSignatureError,
    MissingHookError,
    PluginImportError,
    SpecMismatchError,
    StepSkippedError,
    UnknownHookError,
    did_you_mean,
    one_line,
    quoted_list,
)

LOAD_STEPS = (
    "plugin imports",
    "hook signatures",
    "hook names",
    "required hooks",
    "spec matches metadata",
)


@dataclass(frozen=True)
class LoadedModel:
    """One model plugin registered (with the general plugins) in its own plugin manager."""

    installed: InstalledModel
    pm: pluggy.PluginManager
    plugin: object
    spec: ModelSpec
    general_plugins: tuple[InstalledPlugin, ...] = ()

    @property
    def name(self) -> str:
        return self.installed.name

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def load_model(target: str | Path, revision: str | None = None) -> LoadedModel:
    """Resolve ``target`` (name, alias, checkpoint directory or Hugging Face repo id, at
    ``revision``) and load that model."""
    return ModelLoader(resolve_model(target, revision)).load()


@dataclass
class _Plugin:
    """A plugin object with the words that name it in error messages."""

    obj: object
    pm_name: str  # "<group>:<entry point name>"
    label: str


class ModelLoader:
    """Runs the loading steps of ``LOAD_STEPS`` in order, each at most once."""

    def __init__(self, installed: InstalledModel, general: list[InstalledPlugin] | None = None):
        self.installed = installed
        self.general = tuple(general_plugins() if general is None else general)
        # Before any import: a plugin written for another plugin API may fail in odd ways.
        for p in (installed, *self.general):
            require_supported(p.distribution, p.plugin_api)
        self.pm = new_plugin_manager()
        self._steps: dict[str, Callable[[], None]] = {
            "plugin imports": self._import_plugins,
            "hook signatures": self._register_plugins,
            "hook names": self._check_hook_names,
            "required hooks": self._check_required_hooks,
            "spec matches metadata": self._read_spec,
        }
        assert tuple(self._steps) == LOAD_STEPS
        self._done = 0
        self._failed: str | None = None
        self._model: _Plugin | None = None
        self._generals: list[_Plugin] = []
        self._spec: ModelSpec | None = None

    @property
    def model_label(self) -> str:
        m = self.installed
        return (
            f"model plugin {m.name!r} (distribution {m.distribution!r}, "
            f"entry point '{m.name} = {m.entry_point}')"
        )

    def run_until(self, step: str) -> None:
        """Run every step up to and including ``step`` that has not run yet."""
        target = LOAD_STEPS.index(step)
        while self._done <= target:
            if self._failed is not None:
                raise StepSkippedError(f"not run: step {self._failed!r} failed")
            name = LOAD_STEPS[self._done]
            try:
                self._steps[name]()
            except Exception:
                self._failed = name
                raise
            self._done += 1

    def load(self) -> LoadedModel:
        self.run_until(LOAD_STEPS[-1])
        assert self._model is not None and self._spec is not None
        return LoadedModel(self.installed, self.pm, self._model.obj, self._spec, self.general)

    # -- steps -------------------------------------------------------------------------

    def _import_plugins(self) -> None:
        m = self.installed
        self._model = _Plugin(
            _import(MODELS_GROUP, m.name, m.entry_point, self.model_label),
            f"{MODELS_GROUP}:{m.name}",
            self.model_label,
        )
        for p in self.general:
            label = (
                f"general plugin {p.name!r} (distribution {p.distribution!r}, "
                f"entry point '{p.name} = {p.entry_point}')"
            )
            obj = _import(GENERAL_PLUGINS_GROUP, p.name, p.entry_point, label)
            self._generals.append(_Plugin(obj, f"{GENERAL_PLUGINS_GROUP}:{p.name}", label))

    def _register_plugins(self) -> None:
        assert self._model is not None
        # General plugins first: pluggy calls later registrations first, so a general
        # plugin overrides a model's hook only when it says so (tryfirst or a wrapper).
        for plugin in (*self._generals, self._model):
            if self.pm.is_registered(plugin.obj):
                continue  # one module listed in both groups
            self._check_signatures(plugin)
            try:
                self.pm.register(plugin.obj, name=plugin.pm_name)
            except (pluggy.PluginValidationError, ValueError) as exc:
                raise HookSignatureError(f"{plugin.label}: {one_line(exc)}") from None

    def _check_signatures(self, plugin: _Plugin) -> None:
        # pluggy validates too, but its message spans lines and names no argument cleanly.
        for attr in dir(plugin.obj):
            opts = self.pm.parse_hookimpl_opts(plugin.obj, attr)
            if opts is None:
                continue
            hook_name = opts.get("specname") or attr
            caller = getattr(self.pm.hook, hook_name, None)
            if caller is None or caller.spec is None:
                continue  # an unknown hook: the "hook names" step reports it
            allowed = (*caller.spec.argnames, *caller.spec.kwargnames)
            wrong = [a for a in _required_args(getattr(plugin.obj, attr)) if a not in allowed]
            if wrong:
                raise HookSignatureError(
                    f"{plugin.label}: hookimpl {hook_name!r} takes argument(s) "
                    f"{quoted_list(wrong)} that the hook spec does not have"
                    f"{did_you_mean(wrong[0], allowed)}; the spec's arguments are "
                    f"{quoted_list(allowed)}"
                )

    def _check_hook_names(self) -> None:
        labels = {p.pm_name: p.label for p in (*self._generals, self._model) if p is not None}
        callers = {n: c for n, c in vars(self.pm.hook).items() if not n.startswith("_")}
        known = [n for n, c in callers.items() if c.has_spec()]
        for name, caller in sorted(callers.items()):
            if caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                hint = did_you_mean(name, known) or f"; known hooks: {quoted_list(known)}"
                label = labels.get(impl.plugin_name, repr(impl.plugin_name))
                raise UnknownHookError(f"{label} implements unknown hook {name!r}{hint}")
        try:
            self.pm.check_pending()  # pluggy's own rule, in case it is stricter than ours
        except pluggy.PluginValidationError as exc:
            raise UnknownHookError(one_line(exc)) from None

    def _check_required_hooks(self) -> None:
        assert self._model is not None
        missing = [
            name
            for name in hookspecs.REQUIRED_MODEL_HOOKS
            if not any(
                impl.plugin is self._model.obj
                for impl in getattr(self.pm.hook, name).get_hookimpls()
            )
        ]
        if missing:
            raise MissingHookError(
                f"{self.model_label} does not implement the required hook(s) {quoted_list(missing)}"
            )

    def _read_spec(self) -> None:
        m = self.installed
        try:
            spec = self.pm.hook.mstar_model_spec()
        except Exception as exc:
            raise HookCallError(f"{self.model_label}: mstar_model_spec() raised {one_line(exc)}") from exc
        if not isinstance(spec, ModelSpec):
            raise HookCallError(
                f"{self.model_label}: mstar_model_spec() returned {type(spec).__name__}, "
                "expected a mstar.model.spec.ModelSpec"
            )
        if spec.name and spec.name != m.name:
            raise SpecMismatchError(
                f"{self.model_label}: its ModelSpec is named {spec.name!r} but its "
                f"{MODELS_GROUP} entry point names the model {m.name!r}"
            )
        for field, group, declared in (
            ("aliases", ALIASES_GROUP, m.aliases),
            ("architectures", ARCHITECTURES_GROUP, m.architectures),
        ):
            in_spec = getattr(spec, field)
            if in_spec is not None and set(in_spec) != set(declared):
                raise SpecMismatchError(
                    f"{self.model_label}: ModelSpec {field} [{quoted_list(in_spec)}] differ from "
                    f"the {group} entry points [{quoted_list(declared)}]"
                )
        # The entry points are the identity: the spec carries it from here on.
        self._spec = replace(spec, name=m.name, aliases=tuple(m.aliases), architectures=tuple(m.architectures))


def _import(group: str, name: str, value: str, label: str) -> Any:
    try:
        return metadata.EntryPoint(name, value, group).load()
    except (Exception, SystemExit) as exc:
        raise PluginImportError(f"{label} failed to import: {one_line(exc)}") from exc


def _required_args(func: Any) -> list[str]:
    """Positional parameters without a default: the ones pluggy fills from the call."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
