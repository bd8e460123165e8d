"""Loads a Base checkpoint's clone-prompt encoders: the speaker encoder (``speaker_encoder.*``
of ``model.safetensors``, strictly) and the text tokenizer."""

from __future__ import annotations

from pathlib import Path

from mstar_qwen3tts.clone_prompt import CloneEncoder
from mstar_qwen3tts.config import BASE, ConfigError, Qwen3TTSConfig, load_config
from mstar_qwen3tts.speaker_encoder import SpeakerEncoder
from mstar_qwen3tts.weights import load_speaker_encoder


def load_clone_encoder(checkpoint_dir: Path, device: str = "cpu") -> CloneEncoder:
    from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

    cfg = Qwen3TTSConfig.from_dict(load_config(checkpoint_dir))
    if cfg.tts_model_type != BASE:
        raise ConfigError(f"{checkpoint_dir}: voice cloning needs a Base checkpoint (tts_model_type {cfg.tts_model_type!r})")
    speaker = SpeakerEncoder(cfg.speaker_encoder)
    load_speaker_encoder(speaker, checkpoint_dir)
    tokenizer = load_tokenizer(checkpoint_dir)
    return CloneEncoder(speaker.to(device).eval(), lambda text: encode(tokenizer, text), cfg.talker.num_code_groups)
