"""Hand-written dist-info folders: what an installer leaves, without building anything."""

from __future__ import annotations

from pathlib import Path


def write_dist(site: Path, name: str, entry_points: dict[str, dict[str, str]], version="0.1.0"):
    """What an installer leaves for a distribution: METADATA and entry_points.txt."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    text = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in entry_points.items()
    )
    (info / "entry_points.txt").write_text(text)
