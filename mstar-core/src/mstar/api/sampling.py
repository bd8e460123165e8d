"""Request fields → per-node ``MultiSamplingConfig``s with seeds resolved (in the API
process, so every engine process of a request samples with the same seeds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from mstar.api.errors import ApiError, loc_to_param
from mstar.api.protocol import _SamplingFields
from mstar.sampling import UnknownSamplerLabelError
from mstar.sampling.resolve import per_node_sampling, resolve_node

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
    for field in _DIRECT:
        out.set(field, getattr(req, field))
    if max_tokens is not None:
        out.set("max_tokens", max_tokens[1], max_tokens[0])
    return out


def resolve_sampling(
    node_samplers: Mapping[str, Any], node: str | None, sampling: RequestSampling | Mapping[str, Any] | None
) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """``({node: {"main": {...}, "aux": {...}}}, {node: seed})`` for every sampling node.

    ``sampling`` applies to ``node`` (default: the first sampling node); a mapping is the
    native form, ``{node: {"main":..., "aux":...}}`` or main fields for a one-sampler model.
    """
    per_node: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    if isinstance(sampling, RequestSampling):
        target = node or next(iter(node_samplers), None)
        if target is not None:
            per_node[target] = {"main": sampling.main, "aux": sampling.aux}
        names = sampling.param_names
    elif sampling:
        try:
            per_node = per_node_sampling(node_samplers, sampling)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="sampling") from None
    configs: dict[str, dict[str, Any]] = {}
    seeds: dict[str, int] = {}
    for name, decl in node_samplers.items():
        prefix = "sampling." if not isinstance(sampling, RequestSampling) else ""
        if not isinstance(sampling, RequestSampling) and len(node_samplers) > 1:
            prefix = f"sampling.{name}."
        try:
            cfg, seed = resolve_node(decl, per_node.get(name))
        except UnknownSamplerLabelError as exc:
            raise ApiError(400, str(exc), param=f"{prefix or 'sampling.'}aux", code="unknown_sampler_label") from None
        except ValidationError as exc:
            raise _sampling_error(exc, names, prefix) from None
        configs[name] = cfg.model_dump(mode="json")
        seeds[name] = seed
    return configs, seeds


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
