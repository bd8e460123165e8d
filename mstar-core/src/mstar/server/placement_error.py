"""The error a placement file (or a model's default placement) that cannot be run raises."""

from __future__ import annotations


class PlacementError(ValueError):
    pass
