"""docs/writing-a-plugin.md, part 1, quotes the whole ``qwen3_text`` fixture plugin: its
snippets of each file, put in the file's order, are the file (blank lines aside), with no
elided ``...`` line, so a reader who copies them has a plugin that runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "writing-a-plugin.md"
FILES = ["tests/fixtures/plugins/qwen3_text/fixture_qwen3/plugin.py", "tests/fixtures/plugins/qwen3_text/fixture_qwen3/model.py"]


def _part1_blocks(path: str) -> list[list[str]]:
    part1 = GUIDE.read_text().split("## Part 2")[0]
    blocks = []
    for body in re.findall(r"^```python\n(.*?)^```", part1, re.M | re.S):
        first, *rest = body.splitlines()
        if first.strip() == f"# {path}":
            blocks.append(rest)
    return blocks


@pytest.mark.parametrize("path", FILES)
def test_part_one_quotes_the_whole_file(path: str) -> None:
    source = [line for line in (ROOT / path).read_text().splitlines() if line.strip()]
    blocks = [[line for line in block if line.strip()] for block in _part1_blocks(path)]
    assert blocks and all("..." not in (line.strip() for line in b) for b in blocks)
    blocks.sort(key=lambda b: source.index(b[0]))
    assert [line for b in blocks for line in b] == source
