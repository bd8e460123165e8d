"""Sources and docs cite only what the repository has: no "DESIGN §3" or "seed 002", which
named design notes that were never committed, so a reader could not follow them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MISSING = re.compile(r"\bDESIGN(\.md)?\s*§|\bDESIGN\.md\b|\bseed 00\d\b")
SUFFIXES = {".py", ".md", ".cpp", ".h", ".toml", ".sh"}
# This file names the patterns it looks for.
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()


def test_no_file_cites_a_document_the_repository_lacks():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = [
        f"{name}:{i}: {line.strip()}"
        for name in files
        if Path(name).suffix in SUFFIXES and name != THIS and (ROOT / name).is_file()
        for i, line in enumerate((ROOT / name).read_text(errors="ignore").splitlines(), 1)
        if MISSING.search(line)
    ]
    assert not hits, "say the fact itself, or point to a file under docs/:\n" + "\n".join(hits)
