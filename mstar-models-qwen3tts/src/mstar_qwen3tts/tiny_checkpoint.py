"""Random-weight checkpoints in the real Qwen3-TTS layout, small enough for tests.

The layout matches the published repos (CustomVoice, Base and VoiceDesign: ``kind``): ``config.json``,
``generation_config.json``, ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``
(a small byte-level BPE with the Qwen chat specials), ``model.safetensors`` (``talker.*``)
(plus ``speaker_encoder.*`` for Base) and
``speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors}``. Base and
VoiceDesign checkpoints have no named speakers (empty ``spk_id``).
Weights are drawn from a seeded generator in sorted key order, so a (preset, seed) pair
always gives the same checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

# Codec control ids sit at the same offsets above the codebook as in the real checkpoints
# (there: codebook 2048, pad 2148, bos 2149, eos 2150, think 2154..2157).
_CONTROL = {"codec_pad_id": 100, "codec_bos_id": 101, "codec_eos_token_id": 102, "codec_think_id": 106,
            "codec_nothink_id": 107, "codec_think_bos_id": 108, "codec_think_eos_id": 109}
_LANGUAGES = {"english": 2, "chinese": 7, "japanese": 10, "sichuan_dialect": 14, "beijing_dialect": 26}
_SPEAKERS = {"vivian": (1017, False), "ryan": (1013, False), "eric": (827, "sichuan_dialect"),
             "dylan": (830, "beijing_dialect")}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "talker": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 8, "text_hidden_size": 24, "mrope_section": [2, 1, 1]},
        "predictor": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "num_key_value_heads": 1, "head_dim": 8},
        "codebook_size": 64, "num_code_groups": 4, "max_new_tokens": 48,
        "codec": {"codebook_dim": 16, "latent_dim": 16, "decoder_dim": 16, "hidden_size": 16, "intermediate_size": 32,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                  "sliding_window": 4, "upsample_rates": [4, 3], "upsampling_ratios": [2, 2]},
    },
    # Mid-size (benchmarks): the codec keeps the real 1920-samples-per-frame upsampling.
    "mid": {
        "talker": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 32, "text_hidden_size": 256, "mrope_section": [8, 4, 4]},
        "predictor": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "head_dim": 32},
        "codebook_size": 256, "num_code_groups": 8, "max_new_tokens": 512,
        "codec": {"codebook_dim": 64, "latent_dim": 64, "decoder_dim": 64, "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
                  "sliding_window": 16, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2]},
    },
}


# ---- the text tokenizer ----------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: printable bytes map to themselves, the rest to 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merge_chain(word: str) -> list[tuple[str, str]]:
    return [(word[:i], word[i]) for i in range(1, len(word))]


# A few merges so the BPE actually merges; "assistant" must be one token (the prompt
# layout counts the role as three tokens).
_MERGES: list[tuple[str, str]] = [
    *_merge_chain("assistant"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("o", "n"),
    ("Ġ", "a"), ("r", "e"), ("a", "t"), ("e", "n"), ("s", "t"), ("Ġ", "s"), ("o", "r"), ("Ġ", "w"), ("l", "l"),
]

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TTS_SPECIALS = ["<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
_SPECIAL_GAP = 5  # reserved ids between the chat and the TTS specials, as in the real vocabulary


def _tokenizer_files(path: Path) -> dict[str, int]:
    alphabet = [_bytes_to_unicode()[b] for b in range(256)]
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(alphabet)}
    for a, b in _MERGES:
        vocab.setdefault(a + b, len(vocab))
    base = len(vocab)
    ids = {tok: base + i for i, tok in enumerate(_SPECIALS)}
    ids |= {tok: base + len(_SPECIALS) + _SPECIAL_GAP + i for i, tok in enumerate(_TTS_SPECIALS)}
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in _MERGES) + "\n", encoding="utf-8")
    added = {
        str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for tok, i in ids.items()
    }
    tokenizer_config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    return ids


# ---- configs ---------------------------------------------------------------------------------


# A small ECAPA-TDNN (the released one: channels 512 x4 + 1536, attention 128, scale 8).
_SPEAKER_ENCODER = {"mel_dim": 128, "enc_channels": [16, 16, 16, 16, 48], "enc_kernel_sizes": [5, 3, 3, 3, 1],
                    "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 8, "enc_res2net_scale": 4,
                    "enc_se_channels": 8, "sample_rate": 24000}
KINDS = ("custom_voice", "base", "voice_design")


def _configs(preset: Mapping[str, Any], special_ids: Mapping[str, int], kind: str = "custom_voice") -> tuple[dict, dict, dict]:
    codebook, groups = preset["codebook_size"], preset["num_code_groups"]
    vocab = codebook + 1024  # the control block qwen-tts suppresses is the last 1024 ids
    text_vocab = 16 * math.ceil((max(special_ids.values()) + 1) / 16)
    t, p = preset["talker"], preset["predictor"]
    predictor = {
        "vocab_size": codebook, "num_code_groups": groups, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 64, "attention_bias": False, "use_sliding_window": False,
        **p,
    }
    talker = {
        "vocab_size": vocab, "text_vocab_size": text_vocab, "num_code_groups": groups, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024, "attention_bias": False,
        "use_sliding_window": False, "attention_dropout": 0.0,
        "rope_scaling": {"interleaved": True, "mrope_section": t["mrope_section"], "rope_type": "default", "type": "default"},
        **{k: v for k, v in t.items() if k != "mrope_section"},
        **{k: codebook + v for k, v in _CONTROL.items()},
        "codec_language_id": {k: codebook + v for k, v in _LANGUAGES.items()},
        "spk_id": {k: codebook + v for k, (v, _) in _SPEAKERS.items()} if kind == "custom_voice" else {},
        "spk_is_dialect": {k: d for k, (_, d) in _SPEAKERS.items()} if kind == "custom_voice" else {},
        "code_predictor_config": predictor,
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": "0b6", "tts_model_type": kind,
        "im_start_token_id": special_ids["<|im_start|>"], "im_end_token_id": special_ids["<|im_end|>"],
        "tts_pad_token_id": special_ids["<tts_pad>"], "tts_bos_token_id": special_ids["<tts_text_bos>"],
        "tts_eos_token_id": special_ids["<tts_text_eod>"], "torch_dtype": "float32",
        "talker_config": talker,
        "speaker_encoder_config": {"enc_dim": talker["hidden_size"], **(_SPEAKER_ENCODER if kind == "base" else {"sample_rate": 24000})},
    }
    c = preset["codec"]
    samples = math.prod(c["upsample_rates"]) * math.prod(c["upsampling_ratios"])
    codec = {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": groups, "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": samples, "encode_downsample_rate": samples,
        "decoder_config": {
            "codebook_size": codebook, "num_quantizers": groups, "attention_bias": False, "hidden_act": "silu",
            "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "attention_dropout": 0.0, **c,
        },
        # The codec encoder (in-context voice cloning; weights in Base checkpoints only); kept tiny.
        "encoder_config": {
            "audio_channels": 1, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
            "codebook_size": codebook, "frame_rate": 12.5,
            "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
            "head_dim": 8, "num_filters": 4, "num_hidden_layers": 1, "num_quantizers": 2 * groups,
            "num_semantic_quantizers": 1, "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "upsample_groups": 16,
            "sampling_rate": 24000, "sliding_window": 16, "max_position_embeddings": 256,
        },
    }
    generation = {
        "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
        "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
        "max_new_tokens": preset["max_new_tokens"],
    }
    return config, codec, generation


def _deep_merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in overrides.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


# ---- weights ---------------------------------------------------------------------------------


def _randomize(state: Mapping[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Draw every tensor from ``gen`` in sorted key order, scaled so activations stay O(1)
    and greedy decoding is not a string of near-ties."""
    out: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        shape = state[name].shape

        def normal(std: float, mean: float = 0.0, shape: torch.Size = shape) -> torch.Tensor:
            return torch.randn(shape, generator=gen) * std + mean

        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("cluster_usage"):
            t = torch.rand(shape, generator=gen) + 0.5
        elif name.endswith("embedding_sum"):
            t = normal(1.0)
        elif leaf in ("alpha", "beta"):
            t = normal(0.2)
        elif leaf in ("gamma", "scale"):
            t = normal(0.05, 0.3)
        elif "norm" in name and leaf == "weight":
            t = normal(0.1, 1.0)
        elif leaf == "bias":
            t = normal(0.1)
        elif "embedding" in name:
            t = normal(1.0)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
            gain = 3.0 if ("codec_head" in name or "lm_head" in name) else 1.0
            t = normal(gain / math.sqrt(fan_in))
        out[name] = t.contiguous()
    return out


def _normalize_output(cfg: Any, decoder: dict[str, torch.Tensor], target_std: float = 0.15) -> None:
    """Scale the codec's output conv so random codes give a waveform of ``target_std``:
    audible, and clear of the [-1, 1] clamp (clipped audio would hide differences)."""
    from mstar_qwen3tts.codec_node import CodecNode

    node = CodecNode(cfg.codec)
    node.load_state_dict(decoder)
    out_conv = node.decoder.decoder[-1]
    seen: list[torch.Tensor] = []
    handle = out_conv.register_forward_hook(lambda m, a, o: seen.append(o))
    codes = torch.randint(0, cfg.codec.codebook_size, (1, cfg.codec.num_quantizers, 16),
                          generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        node.decoder(codes)
    handle.remove()
    # Rounded to two digits: the forward's last bits differ between CPUs and thread counts,
    # and the written checkpoint (whose digest the parity fixtures check) must not.
    scale = float(f"{target_std / float(seen[0].std()):.2g}")
    prefix = f"decoder.decoder.{len(node.decoder.decoder) - 1}.conv"
    for key in (f"{prefix}.weight", f"{prefix}.bias"):
        decoder[key] = decoder[key] * scale


def _codec_encoder(codec: Mapping[str, Any]) -> Any:
    from mstar_qwen3tts.codec_encoder import CodecEncoder, EncoderConfig

    return CodecEncoder(EncoderConfig.from_dict(codec["encoder_config"]), codec["encoder_valid_num_quantizers"],
                        codec["encode_downsample_rate"])


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """A digest of names, shapes and bytes (independent of the file's header layout)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_checkpoint(
    path: Path, preset: str = "tiny", seed: int = 0, overrides: Mapping[str, Any] | None = None, kind: str = "custom_voice"
) -> Path:
    """Write a random checkpoint of ``kind`` (``tts_model_type``); ``overrides`` deep-merge
    into ``config.json``. The talker and codec draws come first, so a CustomVoice checkpoint
    is the same whatever this function learns to add for other kinds."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    from mstar_qwen3tts.codec_node import CodecNode
    from mstar_qwen3tts.config import Qwen3TTSConfig
    from mstar_qwen3tts.talker import Talker

    path = Path(path)
    (path / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    special_ids = _tokenizer_files(path)
    config, codec, generation = _configs(PRESETS[preset], special_ids, kind)
    config = _deep_merge(config, overrides or {})
    (path / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    (path / "speech_tokenizer" / "config.json").write_text(json.dumps(codec, indent=2), encoding="utf-8")
    feature_extractor = {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
                         "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}
    (path / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps(feature_extractor, indent=2))

    cfg = Qwen3TTSConfig.from_dict({**config, "generation": generation, "speech_tokenizer": codec})
    gen = torch.Generator().manual_seed(seed)
    talker = _randomize(Talker(cfg).state_dict(), gen)
    decoder = _randomize(CodecNode(cfg.codec).state_dict(), gen)
    _normalize_output(cfg, decoder)
    weights = {f"talker.{k}": v for k, v in talker.items()}
    if kind == "base":
        from mstar_qwen3tts.speaker_encoder import SpeakerEncoder

        weights |= {f"speaker_encoder.{k}": v for k, v in _randomize(SpeakerEncoder(cfg.speaker_encoder).state_dict(), gen).items()}
        # The codec's encoder (audio → codes) serves in-context cloning only: Base checkpoints.
        decoder |= {f"encoder.{k}": v for k, v in _randomize(_codec_encoder(codec).state_dict(), gen).items()}
    save_file(weights, str(path / "model.safetensors"))
    save_file(decoder, str(path / "speech_tokenizer" / "model.safetensors"))
    return path


def write_base_checkpoint(path: Path, **kwargs: Any) -> Path:
    """A tiny Base (voice clone) checkpoint: the ``qwen3tts-base`` model's random weights."""
    return write_checkpoint(path, kind="base", **kwargs)


def write_voice_design_checkpoint(path: Path, **kwargs: Any) -> Path:
    """A tiny VoiceDesign checkpoint (1.7B-shaped config: instructions honoured)."""
    return write_checkpoint(path, kind="voice_design", overrides={"tts_model_size": "1b7", **kwargs.pop("overrides", {})},
                            **kwargs)
