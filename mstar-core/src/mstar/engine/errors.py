"""Whose fault a failed request is: the one place that decides, for the engine and the
engine process alike.

``invalid_request`` (the caller's input: reported as HTTP 400), ``too_large`` (can never
fit this engine's KV pool: 400 ``context_length_exceeded``) or ``internal`` (ours: 500).
"""

from __future__ import annotations

from typing import Literal

ErrorType = Literal["invalid_request", "too_large", "internal"]
Stage = Literal["admission", "prepare", "execution"]

# Admission validates the request's own values (inputs, sampling): a wrong type, a missing
# key or a number out of range there is the caller's. A model's prepare_inputs signals bad
# input with ValueError, as the submodule contract says; anything else it raises is a bug.
_CALLER_ERRORS: dict[Stage, tuple[type[BaseException], ...]] = {
    "admission": (ValueError, TypeError, KeyError, OverflowError),
    "prepare": (ValueError,),
    "execution": (),
}


def classify_error(exc: BaseException, stage: Stage) -> ErrorType:
    if isinstance(exc, _CALLER_ERRORS[stage]):
        return "invalid_request"
    return "internal"
