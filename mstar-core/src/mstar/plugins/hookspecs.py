"""Hook specifications of M* (pluggy project ``"mstar"``).

Every hook is called in the process named in its docstring. A model plugin (entry point
group ``mstar.models``) implements the model hooks; general plugins (group
``mstar.plugins``) are loaded beside it and may override the *policy* hooks: they are
``firstresult`` hooks, so an implementation marked ``tryfirst=True`` (or a ``wrapper``)
in a general plugin wins over the model's. Each hook receives only the arguments it
declares; pluggy rejects a hookimpl naming an argument the spec does not have.

Forbidden in every hook: touching devices at import time, downloading anything, depending
on global mutable state set by another hook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pluggy

PROJECT_NAME = "mstar"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

REQUIRED_MODEL_HOOKS = ("mstar_model_spec", "mstar_node_factories", "mstar_node_samplers")


@hookspec(firstresult=True)
def mstar_model_spec() -> Any:
    """The model's ``ModelSpec`` (config loader, graph builder, tiny-checkpoint writer,
    default placement; name, aliases and architectures come from the entry points).

    Called once in every process that loads the model (CLI, API, engine and preprocess
    worker processes).
    Required. Must be cheap: no weights, no device work.
    """


@hookspec(firstresult=True)
def mstar_node_factories(config: dict) -> Any:
    """``{node name: NodeFactory}`` for every node of the graph. A factory is called as
    ``factory(config, checkpoint_dir, device, dtype=dtype)`` and returns the node's
    ``NodeSubmodule`` built in ``dtype`` (a ``torch.dtype`` core decided from ``--dtype``
    and ``ModelSpec.float32_nodes``), its weights loaded from ``checkpoint_dir``. Core always
    passes a directory: for random weights (``--random-weights``, ``check-plugin``) the tiny
    checkpoint ``ModelSpec.write_tiny_checkpoint`` wrote. A factory without a ``dtype``
    parameter is called without it.

    Called in each engine process for the nodes placed there. Required.
    """


@hookspec(firstresult=True)
def mstar_node_samplers(config: dict) -> Any:
    """``{node name: NodeSamplers}`` for every node that samples: its main defaults and
    its auxiliary sampler labels with their defaults.

    Called once per engine process at start-up and by the API process to validate
    requests. The *label set* must not depend on any request: only the values may vary per
    request. A request naming a label not declared here is rejected at admission. Required
    (return ``{}`` for a model that samples nothing).
    """


@hookspec(firstresult=True)
def mstar_offload_preprocess(model_name: str, request: Any) -> bool | None:
    """Whether this request's preprocessing (tokenization, media decoding, features) runs
    in the API process's preprocess pool (True) or inline (False).

    Called in the API process, per request. ``None``/no implementation means offload.
    A model vetoes per request (e.g. features that must stay on the device); a general
    plugin may override with ``tryfirst``.
    """


@hookspec(firstresult=True)
def mstar_mixed_batch_configs(model_name: str, config: dict) -> Any:
    """``list[MixedBatchConfig]``: which walks of a node may share one forward. Default none.

    Called once per engine process at start-up.
    """


@hookspec(firstresult=True)
def mstar_route_replica(
    model_name: str, group: str, request_kwargs: dict, output_signals: list[str] | None, replicas: list[Any]
) -> int | None:
    """Which replica of placement group ``group`` (one with ``replicas`` > 1) runs this
    request: an index into ``replicas`` (``mstar.server.replicas.ReplicaStats``: index,
    engine, device, serving, outstanding, waiting, running). ``output_signals`` are the
    outputs the client asked for (``None``: all), e.g. whether it wants audio.

    Called in the API process, per request and replicated group it needs, once, when the
    request is submitted; the request keeps that replica for its whole life. ``None``/no
    implementation: the serving replica with the fewest outstanding requests (lowest index
    on a tie). A picked replica that is down answers the request with a 503. A general
    plugin may override with ``tryfirst``.
    """


@hookspec(firstresult=True)
def mstar_piecewise_graph_configs(model_name: str, node: str, submodule: Any) -> Any:
    """``{label: PiecewiseGraphConfig}``: labelled inner regions of ``node``'s forward, run
    through the piecewise runner. With ``uses_sampler`` the runner passes the batch's
    gathered sampler into the region's function. The runner calls regions eagerly today (no
    CUDA graph capture yet); the contract is the one capture will use. Default none.

    Called once per engine process for each node placed there, after the node is built.
    """


@hookspec(firstresult=True)
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    """The model's ``ApiAdapter``: the endpoints it serves and how a request becomes engine
    inputs and sampling configs, and outputs become responses. Its ``routes()`` may add
    routes of the model's own (``mstar.api.routes.AdapterRoute``), mounted with core's auth,
    admission, error shape and metrics.

    Called once in the API process and once in each preprocess worker. Default: none,
    the model serves only what ``/v1/generate`` can express natively.
    """
