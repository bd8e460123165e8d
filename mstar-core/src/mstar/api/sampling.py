"""Request fields → per-node ``MultiSamplingConfig``s with seeds resolved (in the API
process, so every engine process of a request samples with the same seeds).

On the OpenAI-shaped endpoints one request sets every sampling node: the OpenAI fields and
``sampling``'s own fields / ``aux`` drive the adapter's ``sampling_node``; ``sampling.nodes``
sets any sampling node (main fields and ``aux``) by name. A node whose ``seed`` the request
does not set gets one derived from the reported seed (the ``sampling_node``'s) and its name,
so that one seed reproduces every node's draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from mstar.api.errors import ApiError, loc_to_param
from mstar.api.protocol import _SamplingFields
from mstar.sampling import UnknownSamplerLabelError
from mstar.sampling.resolve import per_node_sampling, resolve_node
from mstar.sampling.seeds import derive_seed

# Request fields copied onto SamplingParams fields of the same name.
_DIRECT = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "min_tokens", "ignore_eos",
)


class RequestSampling:
    """The main-sampler fields and aux fields a request set, with the request's own names
    for each field so errors name what the client sent."""

    def __init__(self) -> None:
        self.main: dict[str, Any] = {}
        self.aux: dict[str, dict[str, Any]] = {}
        self.param_names: dict[str, str] = {}
        #: ``sampling.nodes``: node -> its fields as sent (main fields and ``aux``).
        self.nodes: dict[str, dict[str, Any]] = {}

    def set(self, field: str, value: Any, param: str | None = None) -> None:
        if value is not None:
            self.main[field] = value
            self.param_names[field] = param or field


def request_sampling(req: _SamplingFields, *, max_tokens: tuple[str, int | None] | None = None) -> RequestSampling:
    """Collect the sampling fields ``req`` set. ``max_tokens`` is (param name, value)."""
    out = RequestSampling()
    if req.sampling is not None:  # the extension first: top-level OpenAI fields win
        for field, value in req.sampling.main_fields().items():
            out.set(field, value, f"sampling.{field}")
        out.aux = {label: dict(v) for label, v in req.sampling.aux.items()}
        out.nodes = {node: dict(v) for node, v in req.sampling.nodes.items()}
    for field in _DIRECT:
        out.set(field, getattr(req, field))
    if max_tokens is not None:
        out.set("max_tokens", max_tokens[1], max_tokens[0])
    return out


def node_seed(seed: int, node: str) -> int:
    """The seed of a sampling node the request left unseeded, from the reported seed."""
    return derive_seed(seed, f"node:{node}")


def _split(node: str, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    aux = given.get("aux", {})
    if not isinstance(aux, Mapping) or not all(isinstance(v, Mapping) for v in aux.values()):
        raise ApiError(400, f"sampling.nodes.{node}.aux must map labels to objects", param=f"sampling.nodes.{node}.aux", code="invalid_value")
    return {k: v for k, v in given.items() if k != "aux"}, {label: dict(v) for label, v in aux.items()}


def _request_per_node(
    node_samplers: Mapping[str, Any], target: str | None, sampling: RequestSampling
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """The request's per-node sampling and, per node, the request's name of each field."""
    unknown = sorted(set(sampling.nodes) - set(node_samplers))
    if unknown:
        raise ApiError(
            400, f"sampling.nodes names node(s) {unknown} that do not sample; sampling nodes: {sorted(node_samplers)}",
            param=f"sampling.nodes.{unknown[0]}", code="unknown_sampling_node",
        )
    per_node: dict[str, dict[str, Any]] = {}
    names: dict[str, dict[str, str]] = {}
    for node, given in sampling.nodes.items():
        main, aux = _split(node, given)
        per_node[node] = {"main": main, "aux": aux}
        names[node] = {field: f"sampling.nodes.{node}.{field}" for field in main}
    if target is not None:  # OpenAI's fields and sampling's own win for their node
        base = per_node.get(target, {"main": {}, "aux": {}})
        aux = {label: {**base["aux"].get(label, {}), **v} for label, v in sampling.aux.items()}
        per_node[target] = {"main": {**base["main"], **sampling.main}, "aux": {**base["aux"], **aux}}
        names[target] = {**names.get(target, {}), **sampling.param_names}
    return per_node, names


def resolve_sampling(
    node_samplers: Mapping[str, Any], node: str | None, sampling: RequestSampling | Mapping[str, Any] | None
) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """``({node: {"main": {...}, "aux": {...}}}, {node: seed})`` for every sampling node.

    A ``RequestSampling`` applies to ``node`` (default: the first sampling node) and, through
    ``sampling.nodes``, to any other; nodes it leaves unseeded derive their seed from
    ``node``'s (``node_seed``). A mapping is the native form, ``{node: {"main":...,
    "aux":...}}`` or main fields for a one-sampler model; there every unseeded node draws a
    fresh seed and the response reports each.
    """
    per_node: dict[str, dict[str, Any]] = {}
    names: dict[str, dict[str, str]] = {}
    openai_shaped = isinstance(sampling, RequestSampling)
    target = (node or next(iter(node_samplers), None)) if openai_shaped else None
    if isinstance(sampling, RequestSampling):
        per_node, names = _request_per_node(node_samplers, target, sampling)
    elif sampling:
        try:
            per_node = per_node_sampling(node_samplers, sampling)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="sampling") from None
    configs: dict[str, dict[str, Any]] = {}
    seeds: dict[str, int] = {}
    # The reported node first: the others' seeds derive from its.
    order = sorted(node_samplers, key=lambda n: n != target)
    for name in order:
        decl = node_samplers[name]
        if openai_shaped:
            prefix = "" if name == target else f"sampling.nodes.{name}."
        else:
            prefix = f"sampling.{name}." if len(node_samplers) > 1 else "sampling."
        given = per_node.get(name)
        if openai_shaped and target in seeds:  # a node besides the reported one
            given = given or {"main": {}, "aux": {}}
            if given["main"].get("seed") is None:
                given = {**given, "main": {**given["main"], "seed": node_seed(seeds[target], name)}}
        try:
            cfg, seed = resolve_node(decl, given)
        except UnknownSamplerLabelError as exc:
            param = f"{prefix or 'sampling.'}aux"
            if isinstance(sampling, RequestSampling) and name == target and not set(exc.unknown) & set(sampling.aux):
                param = f"sampling.nodes.{name}.aux"  # the label came in the node's own entry
            raise ApiError(400, str(exc), param=param, code="unknown_sampler_label") from None
        except ValidationError as exc:
            raise _sampling_error(exc, names.get(name, {}), prefix) from None
        configs[name] = cfg.model_dump(mode="json")
        seeds[name] = seed
    return configs, {name: seeds[name] for name in node_samplers}


def _sampling_error(exc: ValidationError, names: Mapping[str, str], prefix: str) -> ApiError:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    if loc and loc[0] == "main":
        loc = loc[1:]
    if loc and loc[0] == "aux":
        param = f"{prefix or 'sampling.'}{'.'.join(loc)}"
    elif loc:
        param = names.get(loc[0]) or f"{prefix}{'.'.join(loc)}"
    else:
        param = loc_to_param((), prefix.rstrip(".")) if prefix else None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")
