"""M*: serving composite multimodal models.

Importing ``mstar`` is cheap (no torch); heavy parts load on first use.
"""

from __future__ import annotations

from typing import Any

from mstar.blas_reproducibility import request_strict_mode

# Before anything imports torch: MKL reads its reproducibility mode once, on first use.
request_strict_mode()

from mstar.plugins.api_version import PLUGIN_API_VERSION  # noqa: E402
from mstar.plugins.hookspecs import hookimpl, hookspec  # noqa: E402

__version__ = "0.1.0"
__all__ = ["PLUGIN_API_VERSION", "Engine", "__version__", "hookimpl", "hookspec"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from mstar.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'mstar' has no attribute {name!r}")
