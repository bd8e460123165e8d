"""``mstar check-plugin`` on the good fixture, by name, alias and checkpoint directory."""

from __future__ import annotations

import json

from mstar.plugins.loading import LOAD_STEPS
from plugin_asserts import assert_one_line_error, check_lines


def test_check_plugin_passes_on_the_good_fixture(run_mstar):
    proc = run_mstar("check-plugin", "fixturelm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = check_lines(proc)
    assert set(LOAD_STEPS) <= set(lines)
    assert {"shipped files exist", "graph validates", "node factories cover the graph",
            "sampler labels are static"} <= set(lines)
    assert all(v.startswith("PASS") for v in lines.values()), lines
    assert "fixturelm: all" in proc.stdout


def test_check_plugin_by_alias_with_json(run_mstar):
    proc = run_mstar("check-plugin", "fixture-lm", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "fixturelm" and out["ok"] is True
    assert all(r["status"] == "pass" for r in out["results"])


def test_check_plugin_by_checkpoint_directory(run_mstar, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FixtureLMForCausalLM"]}))
    proc = run_mstar("check-plugin", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "fixturelm"


def test_checkpoint_directory_of_an_unserved_architecture(run_mstar, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NopeForCausalLM"]}))
    assert_one_line_error(
        run_mstar("check-plugin", str(tmp_path)), "NopeForCausalLM", "FixtureLMForCausalLM"
    )


def test_directory_without_config_json(run_mstar, tmp_path):
    assert_one_line_error(run_mstar("check-plugin", str(tmp_path)), "without config.json")
