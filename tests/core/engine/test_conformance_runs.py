"""The conformance kit's run checks: the toy passes them, broken plugins fail them clearly."""

from __future__ import annotations

import pytest
from mstar.engine.piecewise import PiecewiseRunner, check_calling_convention
from mstar.model.spec import PiecewiseGraphConfig
from mstar.testing.conformance import RUN_CHECKS, run_conformance


def test_toy_passes_every_check_including_run_checks():
    report = run_conformance("toy")
    assert report.ok, report.failures
    names = [r.name for r in report.results]
    assert all(c.name in names for c in RUN_CHECKS)


def test_piecewise_signature_drift_fails_at_load_time():
    # A capture function that lost an argument used to kill serving at warm-up; it must fail at load.
    cfg = PiecewiseGraphConfig("head", lambda static_inputs: {}, ("hidden",), uses_sampler=True)
    with pytest.raises(TypeError, match="'head'.*capture_fn must accept"):
        check_calling_convention(cfg)
    with pytest.raises(TypeError):
        PiecewiseRunner(cfg)


def test_model_without_example_requests_fails_the_walk_check(monkeypatch):
    import dataclasses

    from mstar.plugins import loading

    original = loading.ModelLoader._read_spec

    def read_spec_without_examples(self):
        original(self)
        self._spec = dataclasses.replace(self._spec, example_requests=None)

    monkeypatch.setattr(loading.ModelLoader, "_read_spec", read_spec_without_examples)
    report = run_conformance("toy")
    failed = {r.name: r.detail for r in report.failures}
    assert any("example_requests is not set" in d for d in failed.values()), report.results
