"""Real fixture plugin distributions, installed once per session onto temporary sites.

The packages under tests/fixtures/plugins are built into wheels by pip (one call) and
installed with pip into a few ``--target`` folders ("sites"), each with real dist-info
metadata. A test picks the sites it needs; they go on PYTHONPATH of the subprocess, so the
duplicate-name plugins, say, never disturb the other scenarios.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plugins"

# site -> fixture folders installed into it
SITES: dict[str, tuple[str, ...]] = {
    "models": (
        "common",
        "good",
        "broken",
        "typo_arg",
        "typo_hook",
        "no_hook",
        "no_shipped",
        "flaky_labels",
        "mismatch",
        "overrun",
    ),
    "policy": ("policy",),
    "dups": ("common", "dup_a", "dup_b"),
    "alias_clash": ("common", "good", "alias_clash"),
    "api": ("common", "deprecated_arg", "future_api", "bad_api"),  # plugin API versions
}

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]


def _pip(*args: str | Path) -> None:
    proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"pip {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def plugin_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plugin-sites")
    # Build from a copy so setuptools' build/ and egg-info never litter the repo.
    src = root / "src"
    shutil.copytree(FIXTURES, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    wheels = root / "wheels"
    folders = sorted({f for names in SITES.values() for f in names})
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels,
         *(src / f for f in folders))
    sites = {}
    for site, names in SITES.items():
        target = root / site
        files = [_wheel_of(wheels, f) for f in names]
        _pip("install", "--no-deps", "--no-index", "--target", target, *files)
        sites[site] = target
    return sites


def _wheel_of(wheels: Path, folder: str) -> Path:
    (found,) = wheels.glob(f"mstar_fixture_{folder}-*.whl")
    return found


RunMstar = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def run_python(plugin_sites: dict[str, Path]) -> Callable[..., subprocess.CompletedProcess]:
    """Run the venv's python with only the named plugin sites on PYTHONPATH."""

    def run(args: Sequence[str], sites: Sequence[str] = ("models",)) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(str(plugin_sites[s]) for s in sites)
        env["NO_COLOR"] = "1"
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300
        )

    return run


@pytest.fixture(scope="session")
def run_mstar(run_python) -> RunMstar:
    """``mstar ARGS...`` as a subprocess, seeing only the named plugin sites."""

    def run(*args: str, sites: Sequence[str] = ("models",)) -> subprocess.CompletedProcess:
        return run_python(["-m", "mstar.cli.main", *args], sites=sites)

    return run

