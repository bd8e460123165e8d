"""The HTTP side of ``vjepa2``: ``/v1/generate`` inputs → engine inputs (filled in below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar.api import ApiAdapter


class VJEPA2Adapter(ApiAdapter):
    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.config = config


class VJEPA2ACAdapter(ApiAdapter):
    def __init__(self, config: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.config = config
