"""Data types a model plugin returns from its hooks (see ``mstar.plugins.hookspecs``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mstar.plugins.deprecations import accepts_deprecated_arguments

if TYPE_CHECKING:
    from mstar.graph import GraphSpec
    from mstar.model.submodule_base import NodeSubmodule
    from mstar.sampling import SamplingParams

ModelConfig = dict[str, Any]


@accepts_deprecated_arguments  # retired arguments: mstar.plugins.deprecations
@dataclass(frozen=True)
class ModelSpec:
    """How to build a model (who it is comes from its entry points).

    ``load_config(dir)`` reads the checkpoint's config (never hard-coded sizes);
    ``build_graph(config)`` returns its walk graph; ``write_tiny_checkpoint(dir)`` writes a
    tiny random-weight checkpoint in the real layout (tests and ``--random-weights``).
    ``shipped_files`` are files the plugin ships and refers to (placement YAMLs, templates):
    ``mstar check-plugin`` fails when one is missing. ``example_requests(config)`` returns
    requests (``Engine.add_request`` keyword dicts) that together run every walk once on
    the tiny config; the conformance kit runs them through the real engine.
    ``engine_defaults`` are ``EngineConfig`` options the model runs best with (e.g.
    ``{"overlap_nodes": True}`` for an LM and its codec); options the user sets win.
    ``float32_nodes`` are nodes that must run in float32 whatever ``--dtype`` says (a codec
    whose output degrades in half precision); their factories get ``dtype=torch.float32``.
    Names of nodes a checkpoint's graph does not have (e.g. encoders only some variants
    hold) are ignored.

    ``name``, ``aliases`` and ``architectures`` are filled in at load time from the
    distribution's entry points (``mstar.models``, ``mstar.model_aliases``,
    ``mstar.model_architectures``), where discovery reads them without importing the
    plugin. A plugin may leave them out; if it sets them, they must agree.
    """

    load_config: Callable[[Path], ModelConfig]
    build_graph: Callable[[ModelConfig], GraphSpec]
    write_tiny_checkpoint: Callable[[Path], None]
    name: str = ""
    aliases: tuple[str, ...] | None = None
    architectures: tuple[str, ...] | None = None
    default_placement: Mapping[str, str] = field(default_factory=dict)
    shipped_files: tuple[Path, ...] = ()
    example_requests: Callable[[ModelConfig], list[dict[str, Any]]] | None = None
    engine_defaults: Mapping[str, Any] = field(default_factory=dict)
    float32_nodes: tuple[str, ...] = ()


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` as a callable that imports its module on first call,
    so a plugin module stays cheap to import (no torch at import time) without a wrapper
    function per hook value: ``write_tiny_checkpoint=lazy("mstar_toy.checkpoint:write_checkpoint")``."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"lazy target {target!r} must look like 'package.module:function'")

    def resolve() -> Callable[..., Any]:
        import importlib

        return getattr(importlib.import_module(module_name), attr)

    def call(*args: Any, **kwargs: Any) -> Any:
        return resolve()(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"lazy({target})"
    call.resolve = resolve  # type: ignore[attr-defined]  # the function it stands for (its signature)
    return call


NodeFactory = Callable[..., "NodeSubmodule"]
"""``factory(config, checkpoint_dir or None for random init, device, dtype=torch.dtype)`` ->
the node's submodule, built in ``dtype`` (core decides it: ``mstar.model.precision``). A
factory without the ``dtype`` keyword (written before it existed) still works: core casts
its node when the user asked for a dtype explicitly."""


@accepts_deprecated_arguments
@dataclass(frozen=True)
class NodeSamplers:
    """A KV node's sampling declaration: its main defaults and its auxiliary labels.

    The label set is static: it never depends on per-request arguments (values may).
    Core applies the stop rules (``max_tokens``, ``stop_token_ids``, ``ignore_eos``,
    ``min_tokens``) to the main tokens the node draws through its batch sampler; see
    ``mstar.engine.stop_rules``.
    """

    vocab_size: int
    main: SamplingParams
    aux: Mapping[str, SamplingParams] = field(default_factory=dict)
    aux_vocab_sizes: Mapping[str, int] = field(default_factory=dict)
    stop_token_ids: tuple[int, ...] = ()  # end-of-sequence ids (min_tokens suppresses them)
    prompt_signal: str | None = None  # request input holding the prompt ids (penalties)
    # Outputs of a step not sent on when it drew a stop id (None: all of the step's outputs).
    withhold_on_stop: tuple[str, ...] | None = None


@accepts_deprecated_arguments
@dataclass(frozen=True)
class MixedBatchConfig:
    """Walks of one node whose rows may share one forward, run under ``merged_walk``.

    ``max_rows`` caps how many rows of a given walk one mixed step may hold while rows of
    another of its walks are ready (so those keep their pace); with none ready it does not apply.
    """

    node: str
    walks: tuple[str, ...]
    merged_walk: str
    max_rows: Mapping[str, int] = field(default_factory=dict)


@accepts_deprecated_arguments
@dataclass(frozen=True)
class PiecewiseGraphConfig:
    """A labelled inner region of a node's forward, run through the piecewise runner
    (eagerly today: CUDA graph capture is not implemented yet).

    ``capture_fn(static_inputs: dict[str, Tensor], sampler) -> dict[str, Tensor]``: when
    ``uses_sampler`` is set, the runner passes the batch's gathered sampler as ``sampler``
    (``None`` otherwise). ``static_input_names`` are the tensors the caller must pass.
    """

    label: str
    capture_fn: Callable[..., dict[str, Any]]
    static_input_names: tuple[str, ...]
    uses_sampler: bool = False
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
