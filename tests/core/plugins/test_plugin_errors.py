"""Every plugin error, through the CLI as a subprocess: exit != 0, one line, the right names."""

from __future__ import annotations

import pytest
from plugin_asserts import assert_one_line_error, check_lines


def test_unknown_model_lists_installed_and_suggests_nearest(run_mstar):
    proc = run_mstar("check-plugin", "fixturlm")
    line = assert_one_line_error(proc, "unknown model 'fixturlm'", "did you mean 'fixturelm'?")
    for name in ("fixturelm", "brokenlm", "typoarglm"):
        assert repr(name) in line.split("installed models:")[1]


def test_unknown_model_without_any_close_name(run_mstar):
    line = assert_one_line_error(run_mstar("check-plugin", "zzzz"), "unknown model 'zzzz'")
    assert "did you mean" not in line


def test_plugin_that_fails_to_import(run_mstar):
    proc = run_mstar("check-plugin", "brokenlm")
    assert_one_line_error(
        proc,
        "'brokenlm'",
        "distribution 'mstar-fixture-broken'",
        "entry point 'brokenlm = fixture_broken.plugin'",
        "failed to import: RuntimeError: fixture_broken refuses to import",
    )
    assert check_lines(proc)["plugin imports"].startswith("FAIL")


@pytest.mark.parametrize("command", [("models",), ("check-plugin", "duplm")])
def test_two_distributions_claiming_one_model_name(run_mstar, command):
    proc = run_mstar(*command, sites=("dups",))
    assert_one_line_error(
        proc, "model name 'duplm'", "'mstar-fixture-dup-a'", "'mstar-fixture-dup-b'"
    )


def test_two_distributions_claiming_one_alias(run_mstar):
    proc = run_mstar("models", sites=("alias_clash",))
    assert_one_line_error(
        proc, "'fixture-lm'", "'mstar-fixture-good'", "'mstar-fixture-alias-clash'"
    )


def test_hookimpl_with_a_misspelled_argument(run_mstar):
    proc = run_mstar("check-plugin", "typoarglm")
    assert_one_line_error(
        proc,
        "hook signatures",
        "distribution 'mstar-fixture-typo-arg'",
        "hookimpl 'mstar_node_factories'",
        "argument(s) 'cfg'",
        "did you mean 'config'?",
    )
    lines = check_lines(proc)
    assert lines["plugin imports"] == "PASS"
    assert lines["hook signatures"].startswith("FAIL")
    assert lines["required hooks"].startswith("SKIP")


def test_hookimpl_of_a_misspelled_hook(run_mstar):
    proc = run_mstar("check-plugin", "typohooklm")
    assert_one_line_error(
        proc,
        "hook names",
        "distribution 'mstar-fixture-typo-hook'",
        "unknown hook 'mstar_offload_preproces'",
        "did you mean 'mstar_offload_preprocess'?",
    )


def test_missing_required_hook(run_mstar):
    proc = run_mstar("check-plugin", "nohooklm")
    assert_one_line_error(
        proc, "required hooks", "distribution 'mstar-fixture-no-hook'", "'mstar_node_samplers'"
    )


def test_spec_disagreeing_with_metadata(run_mstar):
    proc = run_mstar("check-plugin", "mismatchlm")
    assert_one_line_error(
        proc, "spec matches metadata", "aliases", "'other-alias'", "'mismatch-alias'",
        "mstar.model_aliases",
    )


def test_missing_shipped_file(run_mstar):
    proc = run_mstar("check-plugin", "noshippedlm")
    assert_one_line_error(proc, "shipped files exist", "placement-missing.yaml")
    lines = check_lines(proc)
    # The other checks still ran: one bad file does not hide other problems.
    assert lines["graph validates"] == "PASS" or lines["graph validates"].startswith("PASS")
    assert sum(v.startswith("FAIL") for v in lines.values()) == 1


def test_sampler_label_set_that_changes_between_calls(run_mstar):
    proc = run_mstar("check-plugin", "flakylabelslm")
    assert_one_line_error(
        proc, "sampler labels are static", "codebook0", "codebook1", "must be static"
    )


def test_a_node_that_runs_past_max_tokens_and_stop_ids_fails_the_check(run_mstar):
    proc = run_mstar("check-plugin", "overrunlm")
    assert_one_line_error(proc, "stop rules apply", "ran 5 steps for max_tokens=2", "engine_inputs.sampler")


def test_traceback_flag_shows_the_cause(run_mstar):
    proc = run_mstar("--traceback", "check-plugin", "nosuchmodel")
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "UnknownModelError" in proc.stderr
