"""Loads a Base checkpoint's clone-prompt encoders, strictly: the speaker encoder
(``speaker_encoder.*`` of ``model.safetensors``), the speech tokenizer's encoder (``encoder.*``
of ``speech_tokenizer/model.safetensors``) and the text tokenizer."""

from __future__ import annotations

from pathlib import Path

from mstar_qwen3tts.clone_prompt import CloneEncoder
from mstar_qwen3tts.codec_encoder import CodecEncoder, EncoderConfig
from mstar_qwen3tts.config import BASE, ConfigError, Qwen3TTSConfig, load_config
from mstar_qwen3tts.speaker_encoder import SpeakerEncoder
from mstar_qwen3tts.weights import load_codec_encoder, load_speaker_encoder


def load_clone_encoder(checkpoint_dir: Path, device: str = "cpu") -> CloneEncoder:
    from mstar_qwen3tts.text_tokenizer import encode, load_tokenizer

    cfg = Qwen3TTSConfig.from_dict(load_config(checkpoint_dir))
    if cfg.tts_model_type != BASE:
        raise ConfigError(f"{checkpoint_dir}: voice cloning needs a Base checkpoint (tts_model_type {cfg.tts_model_type!r})")
    speaker = SpeakerEncoder(cfg.speaker_encoder)
    load_speaker_encoder(speaker, checkpoint_dir)
    codec = load_config(checkpoint_dir)["speech_tokenizer"]
    if int(codec.get("encoder_valid_num_quantizers", -1)) != cfg.talker.num_code_groups:
        raise ConfigError(f"{checkpoint_dir}/speech_tokenizer/config.json: encoder_valid_num_quantizers "
                          f"{codec.get('encoder_valid_num_quantizers')} != the talker's num_code_groups {cfg.talker.num_code_groups}")
    rate = int(codec.get("input_sample_rate", 24000))
    encoder = CodecEncoder(EncoderConfig.from_dict(codec["encoder_config"]), cfg.talker.num_code_groups,
                           int(codec["encode_downsample_rate"]))
    if encoder.cfg.sampling_rate != rate:
        raise ConfigError(f"{checkpoint_dir}/speech_tokenizer/config.json: input_sample_rate {rate} != encoder_config.sampling_rate")
    load_codec_encoder(encoder, checkpoint_dir)
    tokenizer = load_tokenizer(checkpoint_dir)
    return CloneEncoder(speaker.to(device).eval(), lambda text: encode(tokenizer, text), cfg.talker.num_code_groups,
                        encoder.to(device).eval(), rate)
