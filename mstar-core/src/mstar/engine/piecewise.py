"""The piecewise-graph runner: runs a node's labelled inner region.

Today the runner calls the region eagerly on every device: no code captures a CUDA graph
yet. The API (labelled regions, static inputs, the batch's gathered sampler passed in) is
the one capture will use, so plugins written against it need no change when it lands.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from mstar.model.spec import PiecewiseGraphConfig


def check_calling_convention(config: PiecewiseGraphConfig) -> None:
    """Fail at load time when ``capture_fn`` cannot be called as the runner calls it."""
    try:
        inspect.signature(config.capture_fn).bind({}, None)
    except TypeError as exc:
        raise TypeError(
            f"piecewise config {config.label!r}: capture_fn must accept (static_inputs, sampler): {exc}"
        ) from exc


class PiecewiseRunner:
    def __init__(self, config: PiecewiseGraphConfig) -> None:
        check_calling_convention(config)
        self.config = config
        self.calls = 0

    def run(self, static_inputs: dict[str, torch.Tensor], sampler: Any = None) -> dict[str, Any]:
        missing = set(self.config.static_input_names) - static_inputs.keys()
        if missing:
            raise KeyError(f"piecewise region {self.config.label!r} is missing static inputs {sorted(missing)}")
        self.calls += 1
        return self.config.capture_fn(static_inputs, sampler if self.config.uses_sampler else None)

    def bind(self, sampler: Any) -> BoundPiecewiseRunner:
        return BoundPiecewiseRunner(self, sampler)


class BoundPiecewiseRunner:
    """A runner bound to one step's gathered sampler: the forward calls ``runner(inputs)``."""

    def __init__(self, runner: PiecewiseRunner, sampler: Any) -> None:
        self.runner = runner
        self.sampler = sampler

    def __call__(self, static_inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
        return self.runner.run(static_inputs, self.sampler)
