"""The checkpoint's tokenizer through ``transformers``, loaded once per process."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from mstar.text.chat_template import Preference, find_chat_template

# Any of these is a tokenizer ``AutoTokenizer`` can build: ``tokenizer.json``, or the files
# of a BPE (``vocab.json`` + ``merges.txt``, as some releases ship them) or SentencePiece model,
# with ``tokenizer_config.json`` naming the class and the added tokens.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer_config.json")


@functools.cache
def _load(path: str, prefer: Preference) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # an optional dependency of core
        raise ImportError(
            "text models need `transformers` for their tokenizer and chat template: "
            "pip install 'mstar-core[text]'"
        ) from exc
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"checkpoint directory {path} has no tokenizer: none of {list(TOKENIZER_FILES)}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    # The template may live in a file the tokenizer class does not read (chat_template.json).
    tokenizer.chat_template = find_chat_template(path, prefer)
    return tokenizer


def load_tokenizer(checkpoint_dir: str | Path, prefer: Preference = "tokenizer") -> Any:
    """``AutoTokenizer.from_pretrained(checkpoint_dir)`` with the checkpoint's chat template
    from ``mstar.text.chat_template.find_chat_template`` (``prefer``: the class whose file
    order wins), cached per process and directory (the API process and each preprocess
    worker load it once). Never downloads: the directory holds ``tokenizer.json`` or
    ``vocab.json`` + ``merges.txt`` (or ``tokenizer.model``) and ``tokenizer_config.json``."""
    path = Path(checkpoint_dir).resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    return _load(str(path), prefer)
