"""The checkpoint's Qwen2 byte-level BPE text tokenizer, read with ``tokenizers``.

A checkpoint ships ``tokenizer.json`` or (as Qwen3-TTS does) ``vocab.json`` +
``merges.txt`` + ``tokenizer_config.json``; the latter is assembled into the same pipeline
the reference builds: NFC, Qwen2's split regex, byte-level BPE, special tokens kept whole.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# Qwen2's pre-tokenization pattern (contractions, letters, single digits, punctuation,
# newlines, spaces).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def load_tokenizer(checkpoint_dir: Path) -> Tokenizer:
    root = Path(checkpoint_dir)
    if (root / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(root / "tokenizer.json"))
    missing = [f for f in ("vocab.json", "merges.txt") if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{root} has no tokenizer.json and is missing {missing}")
    vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split(" ", 1))
        for line in (root / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#version")
    ]
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    specials = sorted((int(i), spec) for i, spec in config.get("added_tokens_decoder", {}).items())
    # Special tokens get their declared ids even where those are not contiguous.
    vocab.update({spec["content"]: token_id for token_id, spec in specials if spec["content"] not in vocab})
    tok = Tokenizer(BPE(vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [
            AddedToken(
                spec["content"],
                single_word=spec.get("single_word", False),
                lstrip=spec.get("lstrip", False),
                rstrip=spec.get("rstrip", False),
                normalized=spec.get("normalized", False),
                special=spec.get("special", True),
            )
            for _, spec in specials
        ]
    )
    for token_id, spec in specials:
        got = tok.token_to_id(spec["content"])
        if got != token_id:
            raise ValueError(f"{config_path}: token {spec['content']!r} is declared as id {token_id} but got {got}")
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids
