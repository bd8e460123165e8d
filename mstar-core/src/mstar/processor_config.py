"""A checkpoint's preprocessing configs, found where ``transformers`` finds them.

Releases name them differently: files saved by transformers 4 keep each processor's config
in its own file (``preprocessor_config.json`` for image processors and feature extractors,
``video_preprocessor_config.json`` for video processors, which older releases also keep in
``preprocessor_config.json``); transformers 5 saves all of them nested in
``processor_config.json``. transformers 5.25 reads (``image_processing_base``,
``video_processing_utils``, ``feature_extraction_utils``) the nested entry first, then the
processor's own files in order; ``processor_config`` does the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

PROCESSOR_FILE = "processor_config.json"
Section = Literal["image_processor", "video_processor", "feature_extractor"]
# Per section: its keys inside processor_config.json, then its own files, in transformers' order.
NESTED_KEYS: dict[str, tuple[str, ...]] = {
    "image_processor": ("image_processor",),
    "video_processor": ("video_processor",),
    "feature_extractor": ("feature_extractor", "audio_processor"),
}
OWN_FILES: dict[str, tuple[str, ...]] = {
    "image_processor": ("preprocessor_config.json",),
    "video_processor": ("video_preprocessor_config.json", "preprocessor_config.json"),
    "feature_extractor": ("preprocessor_config.json",),
}


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def processor_config(checkpoint_dir: str | Path, section: Section) -> dict[str, Any] | None:
    """The config dict of ``section`` as transformers' ``from_pretrained`` of that processor
    reads it from ``checkpoint_dir``, or None when the checkpoint has none."""
    root = Path(checkpoint_dir)
    nested = _json(root / PROCESSOR_FILE) or {}
    for key in NESTED_KEYS[section]:
        if key in nested:
            return nested[key]
    for name in OWN_FILES[section]:
        found = _json(root / name)
        if found is not None:
            return found
    return None
