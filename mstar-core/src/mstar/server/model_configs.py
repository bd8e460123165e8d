"""Several models behind one ``mstar serve``: from repeated ``--model`` or a YAML file.

Each model becomes a ``ServerConfig`` of its own: the server-wide settings (host, port,
API key, limits) from the command line, the model's own (weights, served names,
placement, admission limits, engine options) from its ``--model`` value or YAML entry.

``--model`` values when several are given: ``NAME`` (with ``--random-weights``),
``NAME:WEIGHTS`` (a checkpoint directory or Hub repo id; ``NAME:random`` for the
plugin's tiny random checkpoint), or a checkpoint directory or Hub repo id alone.

YAML (``--models-config``)::

    models:
      - model: orpheus                # name, alias, checkpoint directory or repo id
        weights: /ckpt/orpheus        # or random_weights: true
        served_model_names: [tts, orpheus]
        placement: orpheus.yaml       # relative to this file
        max_concurrency: 16
        dtype: bfloat16               # as --dtype (default: auto)
        engine_options: {kv_budget_bytes: 268435456}
        sampling: {temperature: 0.6, top_p: 0.9, max_tokens: 1200}   # this model's defaults
      - model: /ckpt/qwen3-tts
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mstar.model.precision import canonical_dtype
from mstar.server.config import ServerConfig

RANDOM = "random"  # ``NAME:random``: the plugin's tiny random checkpoint


class ModelEntry(BaseModel):
    """One model of a ``--models-config`` file (unset fields: the command line's values)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    weights: str | None = None
    revision: str | None = None
    random_weights: bool = False
    served_model_names: list[str] = Field(default_factory=list)
    placement: str | None = None
    device: str | None = None
    max_concurrency: int | None = Field(default=None, ge=1)
    max_queue: int | None = Field(default=None, ge=0)
    request_timeout: float | None = Field(default=None, ge=0)
    preprocess_workers: int | None = Field(default=None, ge=0)
    engine_options: dict[str, Any] = Field(default_factory=dict)
    engine_threads: int | None = Field(default=None, ge=1)
    dtype: str | None = None  # as --dtype; an engine_options dtype too
    restart_engines: bool | None = None
    max_engine_restarts: int | None = Field(default=None, ge=0)
    # Defaults of the model's sampling node (any SamplingParams field, and ``aux`` by label);
    # a request's own values win.
    sampling: dict[str, Any] = Field(default_factory=dict)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str | None) -> str | None:
        return None if value is None else canonical_dtype(value)

    @field_validator("served_model_names", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[ModelEntry] = Field(min_length=1)


def from_option(value: str) -> ModelEntry:
    """A ``--model`` value of a several-model command line (see the module docstring)."""
    name, sep, weights = value.partition(":")
    if sep and name and "/" not in name and weights:
        if weights == RANDOM:
            return ModelEntry(model=name, random_weights=True)
        return ModelEntry(model=name, weights=weights)
    return ModelEntry(model=value)


def load_models_file(path: str | Path) -> list[ModelEntry]:
    """The entries of a ``--models-config`` file; a placement path is made relative to
    the file's folder. Raises ``ValueError`` naming the file and the bad field."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    try:
        entries = ModelsFile.model_validate(data).models
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {problems}") from None
    for entry in entries:
        if entry.placement is not None:
            entry.placement = str(path.parent / entry.placement)
    return entries


def model_configs(base: ServerConfig, entries: list[ModelEntry]) -> list[ServerConfig]:
    """One ``ServerConfig`` per entry: ``base`` (the command line) with the entry's fields
    set. ``base.random_weights`` applies to entries naming an installed model (not a
    checkpoint) without weights."""
    from mstar.plugins.discovery import installed_models

    names = {n for m in installed_models() for n in (m.name, *m.aliases)}
    configs = []
    for entry in entries:
        changes: dict[str, Any] = {
            "model": entry.model,
            "weights": entry.weights,
            "revision": entry.revision if entry.revision is not None else base.revision,
            "served_model_names": list(entry.served_model_names),
            "random_weights": entry.random_weights or (base.random_weights and entry.weights is None and entry.model in names),
            "placement": entry.placement,
            "engine_options": {**base.engine_options, **entry.engine_options, **({"dtype": entry.dtype} if entry.dtype else {})},
            "sampling_defaults": dict(entry.sampling),
        }
        for field, attr in (("device", "device"), ("max_concurrency", "max_concurrency"), ("max_queue", "max_queue"),
                            ("request_timeout", "request_timeout_s"), ("preprocess_workers", "preprocess_workers"),
                            ("engine_threads", "engine_threads"), ("restart_engines", "restart_engines"),
                            ("max_engine_restarts", "max_engine_restarts")):
            value = getattr(entry, field)
            if value is not None:
                changes[attr] = value
        configs.append(dataclasses.replace(base, **changes))
    return configs


def with_sampling_defaults(node_samplers: dict[str, Any], node: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """``node_samplers`` with ``defaults`` over the main (and ``aux``) defaults of ``node``
    (the adapter's sampling node; ``None``: the first). Raises ``ValueError`` naming a bad
    field or label."""
    from mstar.sampling.params import SamplingParams

    if not defaults:
        return node_samplers
    node = node or next(iter(node_samplers), None)
    if node is None:
        raise ValueError("sampling: the model samples nothing")
    decl = node_samplers[node]
    main = {k: v for k, v in defaults.items() if k != "aux"}
    aux = defaults.get("aux") or {}
    unknown = sorted(set(aux) - set(decl.aux))
    if unknown:
        raise ValueError(f"sampling.aux: unknown label(s) {unknown}; {node} has {sorted(decl.aux)}")

    def merged(params: SamplingParams, over: dict[str, Any], where: str) -> SamplingParams:
        try:
            return SamplingParams.model_validate({**params.model_dump(), **over})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(map(str, err["loc"]))
            raise ValueError(f"{where}{'.' + field if field else ''}: {err['msg']}") from None

    new = dataclasses.replace(
        decl,
        main=merged(decl.main, main, "sampling"),
        aux={label: merged(p, aux.get(label, {}), f"sampling.aux.{label}") for label, p in decl.aux.items()},
    )
    return {**node_samplers, node: new}
