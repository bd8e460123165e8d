"""What a conformance check is and what the checks of one run share: ``Check``, its
``CheckResult``, the ``CheckFailed`` / ``CheckSkipped`` a check raises, and the
``ConformanceContext`` that computes the loaded plugin, the tiny checkpoint, its config and
graph once. The checks (``mstar.testing.conformance``, ``mstar.testing.run_checks``) and the
kit that runs them import these from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mstar.plugins.discovery import InstalledModel
from mstar.plugins.errors import StepSkippedError
from mstar.plugins.loading import LoadedModel, ModelLoader

Status = Literal["pass", "fail", "skip"]


class CheckFailed(Exception):
    """Raised by a check with the line that explains the failure."""


class CheckSkipped(Exception):
    """A check cannot run because something it needs already failed."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "pass"


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[ConformanceContext], str | None]


class ConformanceContext:
    """What the checks of one run share; each piece is computed at most once."""

    def __init__(self, installed: InstalledModel, workdir: Path):
        self.installed = installed
        self.workdir = workdir  # scratch space for checks; removed after the run
        self.loader = ModelLoader(installed)
        self._cache: dict[str, Any] = {}

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time; later calls return its value, or skip if it failed."""
        if key in self._cache:
            value = self._cache[key]
            if isinstance(value, _Failed):
                raise CheckSkipped(value.reason)
            return value
        try:
            self._cache[key] = compute()
        except CheckSkipped as exc:
            self._cache[key] = _Failed(str(exc))  # skipped for the same reason, later too
            raise
        except Exception:
            self._cache[key] = _Failed(f"needs the {key}, which failed")
            raise
        return self._cache[key]

    @property
    def loaded(self) -> LoadedModel:
        def load() -> LoadedModel:
            try:
                return self.loader.load()
            except StepSkippedError:
                raise CheckSkipped("the plugin did not load") from None

        return self.once("plugin", load)

    @property
    def checkpoint_dir(self) -> Path:
        return self.once("tiny checkpoint", self._write_tiny_checkpoint)

    @property
    def config(self) -> dict[str, Any]:
        return self.once("tiny config", lambda: self.loaded.spec.load_config(self.checkpoint_dir))

    @property
    def graph(self) -> Any:
        return self.once("graph", lambda: self.loaded.spec.build_graph(self.config))

    def _write_tiny_checkpoint(self) -> Path:
        path = self.workdir / "tiny-checkpoint"
        path.mkdir()
        self.loaded.spec.write_tiny_checkpoint(path)
        return path


@dataclass(frozen=True)
class _Failed:
    """Marks a cached piece whose computation raised; ``reason`` is why later users skip."""

    reason: str
