"""``mstar models`` and ``mstar --version`` over really installed fixture distributions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mstar

GOOD = {
    "name": "fixturelm",
    "distribution": "mstar-fixture-good",
    "version": "1.2.3",
    "aliases": ["fixture-lm"],
    "architectures": ["FixtureLMForCausalLM"],
    "entry_point": "fixture_good.plugin",
    "plugin_api": ["1.1"],
    "api_problem": None,
}


def test_version_from_the_console_script():
    script = Path(sys.executable).parent / "mstar"
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mstar, version {mstar.__version__}"


def test_models_table_shows_the_fixture_row(run_mstar):
    proc = run_mstar("models")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if " fixturelm " in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["fixturelm", "mstar-fixture-good", "1.2.3", "fixture-lm", "FixtureLMForCausalLM", "1.1"]
    # Listing reads metadata only: a plugin that fails on import is still listed.
    assert " brokenlm " in proc.stdout


def test_models_json(run_mstar):
    proc = run_mstar("models", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = {m["name"]: m for m in json.loads(proc.stdout)}
    assert listed["fixturelm"] == GOOD
    assert {"brokenlm", "typoarglm", "typohooklm", "nohooklm"} <= set(listed)
    assert "duplm" not in listed  # that site is not on the path here


def test_models_names_general_plugins(run_mstar):
    proc = run_mstar("models", sites=("models", "policy"))
    assert proc.returncode == 0, proc.stderr
    assert "general plugins: site-policy (mstar-fixture-policy 0.1.0)" in proc.stdout


def test_models_does_not_import_torch_or_plugins(run_python):
    # Run the CLI function in-process, then look at what got imported.
    snippet = """
import json, sys
from mstar.cli.main import main
for args in (["models"], ["models", "--json"]):
    try:
        main(args, prog_name="mstar", standalone_mode=False)
    except SystemExit:
        pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy") or m.startswith("fixture_"))
print("IMPORTED=" + json.dumps(heavy))
"""
    proc = run_python(["-c", snippet], sites=("models", "policy"))
    assert proc.returncode == 0, proc.stderr
    assert "fixturelm" in proc.stdout  # it did list the plugins
    imported = json.loads(proc.stdout.rsplit("IMPORTED=", 1)[1])
    assert imported == []
