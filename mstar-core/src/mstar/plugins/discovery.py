"""Which plugins are installed, read from entry-point metadata only.

Nothing here imports a plugin (or torch): listing models must stay cheap and must work
even when a plugin is broken. A model distribution declares

- ``mstar.models``: ``<model name> = <plugin module or object>``
- ``mstar.model_aliases``: ``<alias> = <model name>``
- ``mstar.model_architectures``: ``<HF architecture> = <model name>``
- ``mstar.plugin_api``: ``"<MAJOR.MINOR>" = <package>``, the plugin API version(s) it is
  written against (``mstar.plugins.api_version``)

and general plugins (site policies, backends) use ``mstar.plugins``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mstar.hub import is_repo_id, repo_config
from mstar.plugins.api_version import PLUGIN_API_GROUP, api_problem, require_supported
from mstar.plugins.errors import (
    AmbiguousArchitectureError,
    DuplicateModelError,
    PluginMetadataError,
    UnknownArchitectureError,
    UnknownModelError,
    did_you_mean,
    quoted_list,
)

MODELS_GROUP = "mstar.models"
ALIASES_GROUP = "mstar.model_aliases"
ARCHITECTURES_GROUP = "mstar.model_architectures"
GENERAL_PLUGINS_GROUP = "mstar.plugins"


@dataclass(frozen=True)
class InstalledModel:
    """A model plugin as its distribution's metadata declares it (nothing imported)."""

    name: str
    distribution: str
    version: str
    aliases: tuple[str, ...]
    architectures: tuple[str, ...]
    entry_point: str  # "package.module" or "package.module:object"
    plugin_api: tuple[str, ...] = ()  # the mstar.plugin_api versions declared (none: empty)

    @property
    def api_problem(self) -> str | None:
        """Why this plugin cannot load on this core's plugin API (None: it can)."""
        return api_problem(self.distribution, self.plugin_api)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("aliases", "architectures", "plugin_api"):
            d[key] = list(d[key])
        return d


@dataclass(frozen=True)
class InstalledPlugin:
    """A general plugin (group ``mstar.plugins``), loaded beside every model."""

    name: str
    distribution: str
    version: str
    entry_point: str
    plugin_api: tuple[str, ...] = ()

    @property
    def api_problem(self) -> str | None:
        return api_problem(self.distribution, self.plugin_api)


def _normalized(dist_name: str) -> str:
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def _distributions() -> Iterator[metadata.Distribution]:
    # The same distribution can sit on sys.path twice (an editable install and a copy);
    # the first one wins, as it does for imports.
    seen: set[str] = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or _normalized(name) in seen:
            continue
        seen.add(_normalized(name))
        yield dist


def _models_of(dist: metadata.Distribution) -> list[InstalledModel]:
    eps = dist.entry_points
    models = {ep.name: ep.value.strip() for ep in eps if ep.group == MODELS_GROUP}
    if not models:
        return []
    dist_name = dist.metadata["Name"]
    extra: dict[str, dict[str, list[str]]] = {m: {"aliases": [], "architectures": []} for m in models}
    for group, key in ((ALIASES_GROUP, "aliases"), (ARCHITECTURES_GROUP, "architectures")):
        for ep in eps:
            if ep.group != group:
                continue
            target = ep.value.strip()
            if target not in models:
                raise PluginMetadataError(
                    f"distribution {dist_name!r} declares {group} entry {ep.name!r} for model "
                    f"{target!r}, but its {MODELS_GROUP} entry points only name {quoted_list(models)}"
                )
            extra[target][key].append(ep.name)
    return [
        InstalledModel(
            name=name,
            distribution=dist_name,
            version=dist.version,
            aliases=tuple(sorted(extra[name]["aliases"])),
            architectures=tuple(sorted(extra[name]["architectures"])),
            entry_point=value,
            plugin_api=_plugin_api_of(dist),
        )
        for name, value in models.items()
    ]


def _plugin_api_of(dist: metadata.Distribution) -> tuple[str, ...]:
    return tuple(sorted(ep.name for ep in dist.entry_points if ep.group == PLUGIN_API_GROUP))


def _check_unique(models: list[InstalledModel]) -> None:
    """Every name and alias must point at one model of one distribution."""
    claims: dict[str, tuple[InstalledModel, str]] = {}
    for model in models:
        for key, role in ((model.name, "model"), *((a, "alias") for a in model.aliases)):
            other = claims.get(key)
            if other is None:
                claims[key] = (model, role)
                continue
            if other[0] == model:
                continue  # an alias repeating its own model's name is harmless
            if other[0].distribution == model.distribution:
                raise PluginMetadataError(
                    f"distribution {model.distribution!r} claims {key!r} twice: "
                    f"{_claim(*other)} and {_claim(model, role)}"
                )
            first, second = sorted([other, (model, role)], key=lambda c: c[0].distribution)
            raise DuplicateModelError(
                f"model name {key!r} is claimed by two distributions: "
                f"{first[0].distribution!r} ({_claim(*first)}) and "
                f"{second[0].distribution!r} ({_claim(*second)}); uninstall one of them"
            )


def _claim(model: InstalledModel, role: str) -> str:
    return f"model {model.name!r}" if role == "model" else f"alias of model {model.name!r}"


def installed_models() -> list[InstalledModel]:
    """All installed model plugins, sorted by name.

    Raises ``DuplicateModelError`` when two distributions claim one name or alias: which
    plugin would load is then ambiguous, so it is an error everywhere, not a warning.
    """
    models = [m for dist in _distributions() for m in _models_of(dist)]
    _check_unique(models)
    return sorted(models, key=lambda m: m.name)


def general_plugins() -> list[InstalledPlugin]:
    """All installed general plugins (group ``mstar.plugins``), in a stable order."""
    found = [
        InstalledPlugin(ep.name, dist.metadata["Name"], dist.version, ep.value.strip(), _plugin_api_of(dist))
        for dist in _distributions()
        for ep in dist.entry_points
        if ep.group == GENERAL_PLUGINS_GROUP
    ]
    return sorted(found, key=lambda p: (p.distribution, p.name))


def resolve_model(target: str | Path, revision: str | None = None) -> InstalledModel:
    """The installed model named ``target``: a model name, an alias, a checkpoint
    directory, or a Hugging Face repo id (``org/name``; its ``config.json`` only is fetched,
    at ``revision``), whose ``config.json`` lists an architecture a plugin serves.

    Raises ``PluginApiVersionError`` when that model's distribution is written for a plugin
    API this core does not provide."""
    model = _resolve(target, revision)
    require_supported(model.distribution, model.plugin_api)
    return model


def _resolve(target: str | Path, revision: str | None) -> InstalledModel:
    models = installed_models()
    by_key = {m.name: m for m in models} | {a: m for m in models for a in m.aliases}
    if str(target) in by_key:
        return by_key[str(target)]
    path = Path(target)
    if path.is_dir():
        return _resolve_checkpoint_dir(path, models)
    if is_repo_id(target):
        return _resolve_config(repo_config(str(target), revision), f"config.json of {target}", models)
    if not models:
        raise UnknownModelError(
            f"unknown model {str(target)!r}: no model plugins are installed "
            "(install a distribution that declares a 'mstar.models' entry point)"
        )
    raise UnknownModelError(
        f"unknown model {str(target)!r}{did_you_mean(str(target), by_key)}; "
        f"installed models: {quoted_list(m.name for m in models)}"
    )


def _resolve_checkpoint_dir(path: Path, models: list[InstalledModel]) -> InstalledModel:
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise UnknownArchitectureError(
            f"{path} is a directory without config.json, so its model cannot be recognised; "
            "name the model instead"
        ) from None
    except (OSError, ValueError) as exc:
        raise UnknownArchitectureError(f"cannot read {config_file}: {exc}") from None
    return _resolve_config(config, str(config_file), models)


def _resolve_config(config: Any, config_file: str, models: list[InstalledModel]) -> InstalledModel:
    archs = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(archs, list) or not archs:
        raise UnknownArchitectureError(
            f"{config_file} has no 'architectures' list, so its model cannot be recognised; "
            "name the model instead"
        )
    matches = {m.name: m for m in models for a in archs if a in m.architectures}
    if len(matches) == 1:
        return next(iter(matches.values()))
    if matches:
        found = ", ".join(f"{m.name!r} ({m.distribution})" for m in matches.values())
        raise AmbiguousArchitectureError(
            f"{config_file} architectures {archs} are served by several models: {found}; "
            "name the model instead"
        )
    served = sorted({a for m in models for a in m.architectures})
    raise UnknownArchitectureError(
        f"no installed model serves the architecture(s) {archs} of {config_file}; "
        f"served architectures: {quoted_list(served)}"
    )
