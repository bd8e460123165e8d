"""Main + auxiliary sampling configs of one request, and their seeds.

A plugin declares its auxiliary label set once, at startup. The set must not
depend on per-request kwargs (only the values may): a request naming a label
outside it is rejected rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mstar.sampling.params import SamplingParams
from mstar.sampling.seeds import derive_seed, fresh_seed

#: Label of the main sampler; reserved, so it can never be an aux label.
MAIN_LABEL = "main"


class UnknownSamplerLabelError(ValueError):
    """A sampling config names an auxiliary sampler the model did not declare."""

    def __init__(self, unknown: Iterable[str], declared: Iterable[str]) -> None:
        self.unknown = sorted(unknown)
        self.declared = sorted(declared)
        listed = ", ".join(repr(x) for x in self.declared) or "none"
        super().__init__(
            f"unknown auxiliary sampler label(s) {', '.join(map(repr, self.unknown))}; "
            f"this model declares: {listed}"
        )


def reject_default_seeds(defaults: Mapping[str, SamplingParams]) -> None:
    # A seed in plugin defaults would give every request the same stream.
    for label, params in defaults.items():
        if params.seed is not None:
            raise ValueError(
                f"default sampling params for {label!r} set a seed; seeds are per request"
            )


class MultiSamplingConfig(BaseModel):
    """Sampling config of one request: ``main`` plus aux samplers by label."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    main: SamplingParams = Field(default_factory=SamplingParams)
    aux: dict[str, SamplingParams] = Field(default_factory=dict)

    def validate_labels(self, declared: frozenset[str]) -> None:
        """Raise ``UnknownSamplerLabelError`` if ``aux`` names an undeclared label."""
        declared = frozenset(declared) - {MAIN_LABEL}
        unknown = set(self.aux) - declared
        if unknown:
            raise UnknownSamplerLabelError(unknown, declared)

    @classmethod
    def with_defaults(
        cls,
        main_defaults: SamplingParams,
        aux_defaults: Mapping[str, SamplingParams],
        overrides: MultiSamplingConfig | Mapping[str, Any] | None = None,
    ) -> MultiSamplingConfig:
        """A request's config: plugin defaults with the request's explicit values on top.

        The result has an entry for every declared aux label. ``overrides`` may be a
        config or its dict form (``{"main": {...}, "aux": {label: {...}}}``); only
        fields the request set explicitly override a default.
        """
        if overrides is None:
            req = cls()
        elif isinstance(overrides, MultiSamplingConfig):
            req = overrides
        else:
            req = cls.model_validate(overrides)
        req.validate_labels(frozenset(aux_defaults))
        reject_default_seeds({MAIN_LABEL: main_defaults, **aux_defaults})
        return cls(
            main=main_defaults.override(req.main),
            aux={label: d.override(req.aux.get(label)) for label, d in aux_defaults.items()},
        )

    def resolve_seeds(self) -> tuple[MultiSamplingConfig, int]:
        """Return (config with every seed set, the request seed to report to the client).

        A missing main seed becomes a fresh random one; a missing aux seed is derived
        from the request seed and the label, so the reported seed reproduces all of them.
        """
        seed = self.main.seed if self.main.seed is not None else fresh_seed()
        aux = {
            label: p if p.seed is not None else p.override({"seed": derive_seed(seed, label)})
            for label, p in self.aux.items()
        }
        return MultiSamplingConfig(main=self.main.override({"seed": seed}), aux=aux), seed
