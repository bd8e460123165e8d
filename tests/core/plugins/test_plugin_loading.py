"""The real loading path (``load_model``) seen from Python, in a subprocess per scenario."""

from __future__ import annotations

import json

LOAD = """
import json, sys
from mstar.plugins.loading import load_model
loaded = load_model(sys.argv[1])
print(json.dumps({
    "name": loaded.spec.name,
    "offload": loaded.hook.mstar_offload_preprocess(model_name=loaded.name, request={}),
    "general": [p.name for p in loaded.general_plugins],
    "imported": sorted(m for m in sys.modules if m.startswith("fixture_")),
}))
"""


def _load(run_python, target, sites):
    proc = run_python(["-c", LOAD, target], sites=sites)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_loading_imports_only_that_plugin(run_python):
    out = _load(run_python, "fixturelm", ("models",))
    assert out["name"] == "fixturelm"
    # Not the broken plugin, nor any other installed one.
    assert out["imported"] == ["fixture_common", "fixture_good", "fixture_good.plugin"]
    assert out["offload"] is False  # the model's own policy: keep preprocessing inline


def test_general_plugin_overrides_the_model_policy_hook(run_python):
    out = _load(run_python, "fixture-lm", ("models", "policy"))
    assert out["general"] == ["site-policy"]
    assert "fixture_policy.plugin" in out["imported"]
    assert out["offload"] is True  # the site plugin's tryfirst impl wins
