"""The checkpoint's tokenizer through ``transformers``, loaded once per process."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.cache
def _load(path: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # an optional dependency of core
        raise ImportError(
            "text models need `transformers` for their tokenizer and chat template: "
            "pip install 'mstar-core[text]'"
        ) from exc
    return AutoTokenizer.from_pretrained(path)


def load_tokenizer(checkpoint_dir: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained(checkpoint_dir)``, cached per process and directory
    (the API process and each preprocess worker load it once). Never downloads: the
    directory must hold the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``)."""
    path = Path(checkpoint_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    return _load(str(path))
