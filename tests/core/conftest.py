"""Fixtures shared by the core tests."""

from __future__ import annotations

import os
from types import ModuleType

import pytest
from mstar.native import native_module

# CI sets this (.ci/run): there a C++ compiler is present, so an extension that does not
# build must fail the native parity tests rather than skip them and let C++ drift from Python.
REQUIRE_NATIVE = "MSTAR_REQUIRE_NATIVE"


@pytest.fixture(scope="session")
def native_ops() -> ModuleType:
    """The built native extension (``mstar.native``). Where it cannot be built, or
    ``MSTAR_NATIVE_OPS=0`` turns it off, the test is skipped, or fails under
    ``MSTAR_REQUIRE_NATIVE=1``."""
    module = native_module()
    if module is not None:
        return module
    if os.environ.get("MSTAR_NATIVE_OPS", "1") == "0":
        reason = "MSTAR_NATIVE_OPS=0 turns the native ops off"
    else:
        reason = "no C++ toolchain to build the native ops (mstar.native logged why)"
    if os.environ.get(REQUIRE_NATIVE) == "1":
        pytest.fail(f"{REQUIRE_NATIVE}=1 but the native ops are unavailable: {reason}", pytrace=False)
    pytest.skip(reason)
