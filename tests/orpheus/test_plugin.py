"""The plugin as the CLI and the loader see it."""

from __future__ import annotations

import subprocess
import sys

from mstar.plugins.discovery import resolve_model


def _mstar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mstar.cli", *args], capture_output=True, text=True, timeout=300)


def test_check_plugin_passes():
    proc = _mstar("check-plugin", "orpheus")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every walk runs once" in proc.stdout and "seeded requests reproduce" in proc.stdout


def test_models_lists_orpheus_with_aliases():
    proc = _mstar("models")
    assert proc.returncode == 0 and "orpheus" in proc.stdout and "orpheus-tts" in proc.stdout


def test_checkpoint_directory_resolves_to_orpheus(ckpt):
    assert resolve_model(ckpt).name == "orpheus"
    assert resolve_model("orpheus-3b").name == "orpheus"
