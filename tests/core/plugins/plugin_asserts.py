"""Assertions shared by the plugin CLI tests."""

from __future__ import annotations

import subprocess


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The command failed with one clear error line on stderr that names every needle."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def check_lines(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """``mstar check-plugin`` output as {check name: "PASS"/"FAIL: detail"/...}."""
    lines = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition("  ")
        if word in ("PASS", "FAIL", "SKIP"):
            name, _, detail = rest.partition(": ")
            lines[name] = f"{word}: {detail}" if detail else word
    return lines
