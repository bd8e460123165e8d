"""Rewrite an already written tiny checkpoint into the file layouts real releases use.

Tiny checkpoint writers always produce the same files (``tokenizer.json``, a template where
the writer puts it, ``generation_config.json`` with end ids, one preprocessing config...),
while releases differ: a multimodal release may ship its template only in
``chat_template.json``, its tokenizer as ``vocab.json`` + ``merges.txt`` and a
``generation_config.json`` that names no end id;
files saved by transformers 5 keep the template in ``chat_template.jinja`` and the
preprocessing configs nested in ``processor_config.json``; older configs say ``torch_dtype``
where newer say ``dtype``. Each transform here turns a written checkpoint into one such
variant, in place; ``variant_copy`` applies several to a copy. A plugin's tests run its
checkpoint through every variant its releases use and check it still serves and matches its
reference (which reads the same rewritten files).

    ckpt = variant_copy(written, tmp / "v", "template_in_chat_template_json", "slow_tokenizer_files")
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mstar.text.chat_template import (
    JINJA_DIR,
    JINJA_FILE,
    PROCESSOR_TEMPLATE_FILE,
    find_chat_template,
)

TOKENIZER_CONFIG = "tokenizer_config.json"
PROCESSOR_CONFIG = "processor_config.json"
GENERATION_CONFIG = "generation_config.json"
# Written into, never in place by these transforms: copies may hard-link them.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, data: Mapping[str, Any]) -> None:
    path.unlink(missing_ok=True)  # a new file: never write through a hard link
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


# ---- the chat template --------------------------------------------------------------------


def _take_template(root: Path) -> str:
    """Remove the checkpoint's chat template from every file that holds one; return it."""
    template = find_chat_template(root)
    if not isinstance(template, str):
        raise ValueError(f"{root}: expected one chat template, found {type(template).__name__}")
    (root / JINJA_FILE).unlink(missing_ok=True)
    shutil.rmtree(root / JINJA_DIR, ignore_errors=True)
    (root / PROCESSOR_TEMPLATE_FILE).unlink(missing_ok=True)
    for name in (TOKENIZER_CONFIG, PROCESSOR_CONFIG):
        if (root / name).is_file():
            config = _read(root / name)
            if config.pop("chat_template", None) is not None:
                _write(root / name, config)
    return template


def template_in_chat_template_jinja(root: Path) -> None:
    """The template only in ``chat_template.jinja`` (what transformers 5 saves)."""
    template = _take_template(root)
    (root / JINJA_FILE).write_text(template, encoding="utf-8")


def template_in_chat_template_json(root: Path) -> None:
    """The template only in ``chat_template.json`` (the processor's legacy file)."""
    _write(root / PROCESSOR_TEMPLATE_FILE, {"chat_template": _take_template(root)})


def template_in_tokenizer_config(root: Path) -> None:
    """The template only in ``tokenizer_config.json`` (text LLMs saved by transformers 4)."""
    template = _take_template(root)
    _write(root / TOKENIZER_CONFIG, {**_read(root / TOKENIZER_CONFIG), "chat_template": template})


def without_chat_template(root: Path) -> None:
    _take_template(root)


# ---- the tokenizer ------------------------------------------------------------------------


def slow_tokenizer_files(root: Path) -> None:
    """``tokenizer.json`` (a BPE) replaced by ``vocab.json`` + ``merges.txt``, its added tokens
    moved into ``tokenizer_config.json``'s ``added_tokens_decoder``: the files of
    transformers 4's slow tokenizers, which some releases ship without a ``tokenizer.json``.
    ``tokenizer_config.json`` must name a class that builds from them (a BPE tokenizer class)."""
    spec = _read(root / "tokenizer.json")
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{root}/tokenizer.json is a {model.get('type')} tokenizer, not a BPE")
    config = _read(root / TOKENIZER_CONFIG)
    if config.get("tokenizer_class") in (None, "PreTrainedTokenizerFast", "TokenizersBackend"):
        raise ValueError(f"{root}/{TOKENIZER_CONFIG} names no tokenizer class that builds from vocab.json + merges.txt")
    _write(root / "vocab.json", model["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (root / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    fields = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    added = {str(t["id"]): {k: t[k] for k in fields} for t in spec.get("added_tokens", [])}
    _write(root / TOKENIZER_CONFIG, {**config, "added_tokens_decoder": added})
    (root / "tokenizer.json").unlink()


# ---- generation config, dtype key ---------------------------------------------------------


def without_generation_config(root: Path) -> None:
    (root / GENERATION_CONFIG).unlink(missing_ok=True)


def generation_config_without_eos(root: Path) -> None:
    """``generation_config.json`` naming no end id (the model's ``generate`` supplies its own)."""
    path = root / GENERATION_CONFIG
    config = _read(path) if path.is_file() else {}
    config.pop("eos_token_id", None)
    _write(path, config)


def _rename_key(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {(new if k == old else k): _rename_key(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_key(v, old, new) for v in value]
    return value


def dtype_key(root: Path) -> None:
    """Config dtype keys spelled ``dtype`` (transformers >= 4.56), at every nesting level."""
    for path in _configs(root):
        _write(path, _rename_key(_read(path), "torch_dtype", "dtype"))


def torch_dtype_key(root: Path) -> None:
    """Config dtype keys spelled ``torch_dtype`` (transformers < 4.56)."""
    for path in _configs(root):
        _write(path, _rename_key(_read(path), "dtype", "torch_dtype"))


def _configs(root: Path) -> list[Path]:
    return sorted(root.rglob("config.json"))


# ---- preprocessing configs ----------------------------------------------------------------


def processor_configs_nested(root: Path) -> None:
    """``preprocessor_config.json`` / ``video_preprocessor_config.json`` moved into
    ``processor_config.json`` (what transformers 5 saves): the video processor's from its own
    file, the image processor's and feature extractor's from ``preprocessor_config.json``."""
    shared, video = root / "preprocessor_config.json", root / "video_preprocessor_config.json"
    nested = _read(root / PROCESSOR_CONFIG) if (root / PROCESSOR_CONFIG).is_file() else {}
    if shared.is_file():
        config = _read(shared)
        if "feature_extractor_type" in config:
            nested["feature_extractor"] = config
        if "image_processor_type" in config:
            nested["image_processor"] = config
        shared.unlink()
    if video.is_file():
        nested["video_processor"] = _read(video)
        video.unlink()
    _write(root / PROCESSOR_CONFIG, nested)


def video_config_as_preprocessor_config(root: Path) -> None:
    """``video_preprocessor_config.json`` renamed ``preprocessor_config.json`` (the name video
    processors used before transformers split them from image processors)."""
    (root / "video_preprocessor_config.json").rename(root / "preprocessor_config.json")


def without_video_preprocessor_config(root: Path) -> None:
    (root / "video_preprocessor_config.json").unlink(missing_ok=True)


# ---- weights ------------------------------------------------------------------------------


def sharded(root: Path, num_shards: int = 3) -> None:
    """Weights in ``num_shards`` files with an index (``mstar.testing.sharding``)."""
    from mstar.testing.sharding import shard_checkpoint

    shard_checkpoint(root, num_shards)


TRANSFORMS: dict[str, Callable[[Path], None]] = {
    f.__name__: f
    for f in (
        template_in_chat_template_jinja,
        template_in_chat_template_json,
        template_in_tokenizer_config,
        without_chat_template,
        slow_tokenizer_files,
        without_generation_config,
        generation_config_without_eos,
        dtype_key,
        torch_dtype_key,
        processor_configs_nested,
        video_config_as_preprocessor_config,
        without_video_preprocessor_config,
        sharded,
    )
}


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """``src`` copied to ``dst`` (created): weight files hard-linked where the filesystem
    allows (the transforms replace files, never write into them), the rest copied."""
    src, dst = Path(src), Path(dst)
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix in WEIGHT_SUFFIXES:
            try:
                os.link(path, target)
                continue
            except OSError:
                pass
        shutil.copy2(path, target)
    return dst


def variant_copy(src: Path, dst: Path, *transforms: str) -> Path:
    """A copy of checkpoint ``src`` at ``dst`` with the named ``TRANSFORMS`` applied in order."""
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown:
        raise KeyError(f"unknown layout transform(s) {unknown}; known: {sorted(TRANSFORMS)}")
    root = copy_checkpoint(src, dst)
    for name in transforms:
        TRANSFORMS[name](root)
    return root
