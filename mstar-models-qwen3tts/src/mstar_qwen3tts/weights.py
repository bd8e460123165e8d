"""Strict weight loading from the checkpoint's safetensors files.

``model.safetensors`` holds ``talker.*`` and, in Base checkpoints, ``speaker_encoder.*``;
``speech_tokenizer/model.safetensors`` holds ``decoder.*`` and the audio encoder's
``encoder.*`` (in-context voice cloning; ``load_codec_encoder``), each skipped by the other's loader. Any
other missing or unexpected key, or a shape that differs, is one error listing them all.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

TALKER_FILE = "model.safetensors"
CODEC_FILE = "speech_tokenizer/model.safetensors"


class WeightsError(ValueError):
    pass


def _load_strict(module: nn.Module, path: Path, keep: str, strip: str, skip: tuple[str, ...] = ()) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"Qwen3-TTS checkpoint is missing {path}")
    expected = module.state_dict()
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            if key.startswith(keep):
                name = key[len(strip):]
                if name in expected:
                    state[name] = f.get_tensor(key)
                else:
                    unexpected.append(key)
            elif not (skip and key.startswith(skip)):
                unexpected.append(key)
    missing = sorted(strip + k for k in expected.keys() - state.keys())
    wrong = sorted(
        f"{strip}{k}: {tuple(v.shape)} in file, {tuple(expected[k].shape)} expected"
        for k, v in state.items()
        if v.shape != expected[k].shape
    )
    if missing or unexpected or wrong:
        parts = [f"missing keys {missing}" if missing else "", f"unexpected keys {sorted(unexpected)}" if unexpected else "",
                 f"shape mismatches {wrong}" if wrong else ""]
        raise WeightsError(f"{path}: " + "; ".join(p for p in parts if p))
    module.load_state_dict(state, strict=True)


def load_talker(module: nn.Module, checkpoint_dir: Path, base: bool = False) -> None:
    """``base``: the file also holds the speaker encoder (``load_speaker_encoder`` reads it);
    elsewhere a ``speaker_encoder.*`` key is unexpected."""
    skip = ("speaker_encoder.",) if base else ()
    _load_strict(module, Path(checkpoint_dir) / TALKER_FILE, keep="talker.", strip="talker.", skip=skip)


def load_speaker_encoder(module: nn.Module, checkpoint_dir: Path) -> None:
    _load_strict(module, Path(checkpoint_dir) / TALKER_FILE, keep="speaker_encoder.", strip="speaker_encoder.",
                 skip=("talker.",))


def load_codec_encoder(module: nn.Module, checkpoint_dir: Path) -> None:
    """The speech tokenizer's encoder (``encoder.*``; the decoder's keys are skipped)."""
    _load_strict(module, Path(checkpoint_dir) / CODEC_FILE, keep="encoder.", strip="encoder.", skip=("decoder.",))


def load_codec(module: nn.Module, checkpoint_dir: Path) -> None:
    """``module``'s keys start with ``decoder.`` like the file's."""
    _load_strict(module, Path(checkpoint_dir) / CODEC_FILE, keep="decoder.", strip="", skip=("encoder.",))
