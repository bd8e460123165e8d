"""Test modules are imported by basename (rootdir-relative, no packages): two test files
with one name make pytest refuse to collect the whole suite. Say which, plainly."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "fixtures" in path.parts or path.name in ("conftest.py", "__init__.py"):
            continue
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
