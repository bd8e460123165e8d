"""Where each module's tensors are in a Qwen3-TTS checkpoint, as arguments of core's
``mstar.weights.load_weights`` (which reads ``model.safetensors`` or HF's shards, strictly).

``model.safetensors`` holds ``talker.*`` and, in Base checkpoints, ``speaker_encoder.*``;
``speech_tokenizer/model.safetensors`` holds the codec decoder's ``decoder.*`` and the
audio encoder's ``encoder.*`` (in-context voice cloning). Each module's load skips the
other's keys; any other key is unexpected.
"""

from __future__ import annotations

from typing import Any

CODEC_DIR = "speech_tokenizer"

SPEAKER_ENCODER_KEYS: dict[str, Any] = dict(prefix="speaker_encoder.", skip=("talker.",))
CODEC_KEYS: dict[str, Any] = dict(skip=("encoder.",))  # the codec node's names keep ``decoder.``
CODEC_ENCODER_KEYS: dict[str, Any] = dict(prefix="encoder.", skip=("decoder.",))


def talker_keys(base: bool) -> dict[str, Any]:
    """``base``: the file also holds the speaker encoder; elsewhere its keys are unexpected."""
    return dict(prefix="talker.", skip=("speaker_encoder.",) if base else ())
