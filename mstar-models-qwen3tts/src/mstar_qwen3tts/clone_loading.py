"""Loads a Base checkpoint's clone-prompt encoders, strictly (core's ``load_weights``): the
speaker encoder (``speaker_encoder.*`` of ``model.safetensors``), the speech tokenizer's
encoder (``encoder.*`` of ``speech_tokenizer/model.safetensors``) and the text tokenizer.
``clone_prompt.CloneEncoder.from_checkpoint`` runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mstar.weights import load_weights

from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_ENCODER_KEYS, SPEAKER_ENCODER_KEYS
from mstar_qwen3tts.codec_encoder import CodecEncoder, EncoderConfig
from mstar_qwen3tts.config import BASE, ConfigError, Qwen3TTSConfig, load_config
from mstar_qwen3tts.speaker_encoder import SpeakerEncoder


def codec_encoder_rates(config: dict[str, Any]) -> tuple[int, int]:
    """(the speech tokenizer's input sample rate, samples per frame), checked against the
    talker; ``config``: ``load_config``'s merged dict."""
    codec = config["speech_tokenizer"]
    groups = Qwen3TTSConfig.from_dict(config).talker.num_code_groups
    if int(codec.get("encoder_valid_num_quantizers", -1)) != groups:
        raise ConfigError(f"speech_tokenizer/config.json: encoder_valid_num_quantizers "
                          f"{codec.get('encoder_valid_num_quantizers')} != the talker's num_code_groups {groups}")
    rate = int(codec.get("input_sample_rate", 24000))
    if int(codec["encoder_config"].get("sampling_rate", 24000)) != rate:
        raise ConfigError("speech_tokenizer/config.json: input_sample_rate != encoder_config.sampling_rate")
    return rate, int(codec["encode_downsample_rate"])


def codec_encoder_from_config(config: dict[str, Any]) -> CodecEncoder:
    """The speech tokenizer's encoder, random weights (``CODEC_ENCODER_KEYS`` locate its own)."""
    _, downsample = codec_encoder_rates(config)
    groups = Qwen3TTSConfig.from_dict(config).talker.num_code_groups
    return CodecEncoder(EncoderConfig.from_dict(config["speech_tokenizer"]["encoder_config"]), groups, downsample)


def reference_frames(config: dict[str, Any], samples: int) -> int:
    """The frames of ``ref_codes`` the speech tokenizer's encoder gives for ``samples`` samples
    at its rate (the prompt's layout needs them before the encoder runs)."""
    _, downsample = codec_encoder_rates(config)
    return EncoderConfig.from_dict(config["speech_tokenizer"]["encoder_config"]).output_frames(samples, downsample)


@dataclass(frozen=True)
class CloneModels:
    """What a clone prompt is computed with, loaded on one device."""

    speaker_encoder: SpeakerEncoder
    tokenize: Callable[[str], list[int]]
    num_code_groups: int
    codec_encoder: CodecEncoder
    codec_rate: int  # the speech tokenizer's input sample rate


def load_clone_models(checkpoint_dir: Path, device: str = "cpu") -> CloneModels:
    from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

    config = load_config(checkpoint_dir)
    cfg = Qwen3TTSConfig.from_dict(config)
    if cfg.tts_model_type != BASE:
        raise ConfigError(f"{checkpoint_dir}: voice cloning needs a Base checkpoint (tts_model_type {cfg.tts_model_type!r})")
    speaker = SpeakerEncoder(cfg.speaker_encoder)
    load_weights(speaker, checkpoint_dir, **SPEAKER_ENCODER_KEYS)
    rate, _ = codec_encoder_rates(config)
    encoder = codec_encoder_from_config(config)
    load_weights(encoder, Path(checkpoint_dir) / CODEC_DIR, **CODEC_ENCODER_KEYS)
    tokenizer = load_tokenizer(checkpoint_dir)
    return CloneModels(speaker.to(device).eval(), lambda text: encode(tokenizer, text), cfg.talker.num_code_groups,
                       encoder.to(device).eval(), rate)
