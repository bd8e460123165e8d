"""The checkpoint's configuration: ``config.json``, ``generation_config.json`` and
``speech_tokenizer/config.json``, read into typed views (never hard-coded sizes).

``load_config`` returns a plain dict (hooks pass it between processes); ``Qwen3TTSConfig``
is the typed view every module builds from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
MODEL_TYPE = "qwen3_tts"
CODEC_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
# ``tts_model_type``: CustomVoice (named speakers, optional instructions on 1.7B), Base (voice
# clone from reference audio: a speaker encoder ships in model.safetensors) and VoiceDesign
# (the voice described in the instructions).
CUSTOM_VOICE, BASE, VOICE_DESIGN = "custom_voice", "base", "voice_design"
MODEL_TYPES = (CUSTOM_VOICE, BASE, VOICE_DESIGN)

# qwen-tts suppresses the talker's last 1024 ids (its control and speaker block) except
# EOS when sampling the first codebook; the block size is fixed there, not in the config.
CONTROL_BLOCK = 1024

# Streaming defaults (frames of 80 ms at 12.5 Hz): a small first chunk so audio starts
# early, larger chunks after. ``stateful`` decodes each chunk from its new frames plus the
# decoder's carried state; ``stateful: false`` re-decodes ``left_context`` frames instead
# (None means "the decoder's exact receptive field"). Either way seams never change the audio.
# ``codec_batch``: rows of every stateful codec call (None: 8 on CUDA; on other devices 1 for
# streams at their first chunk and 4 after, see factories.codec_batches);
# ``encoder_batch``: rows of every clone-encoder call (Base; None: 8 on CUDA, 1 elsewhere).
DEFAULT_STREAMING: dict[str, int | bool | None] = {
    "chunk": 12, "first_chunk": 4, "left_context": None, "stateful": True, "codec_batch": None, "encoder_batch": None,
}


class ConfigError(ValueError):
    """A checkpoint's configuration is missing a value or holds one this plugin cannot serve."""


def _get(d: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise ConfigError(f"{where}: missing {key!r}")
    return default


@dataclass(frozen=True)
class TransformerConfig:
    """A Qwen3-style decoder stack (the talker and the code predictor share the shape)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> TransformerConfig:
        act = _get(d, "hidden_act", where, "silu")
        if act != "silu":
            raise ConfigError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
        if _get(d, "use_sliding_window", where, False):
            raise ConfigError(f"{where}: use_sliding_window is not supported")
        rope = d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{where}: rope_scaling type {rope_type!r} is not supported")
        hidden = int(_get(d, "hidden_size", where))
        heads = int(_get(d, "num_attention_heads", where))
        kv_heads = int(_get(d, "num_key_value_heads", where, heads))
        if heads % kv_heads:
            raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        return cls(
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", where)),
            num_hidden_layers=int(_get(d, "num_hidden_layers", where)),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(_get(d, "head_dim", where, hidden // heads)),
            rms_norm_eps=float(_get(d, "rms_norm_eps", where, 1e-6)),
            rope_theta=float(_get(d, "rope_theta", where, 10000.0)),
            max_position_embeddings=int(_get(d, "max_position_embeddings", where, 32768)),
            attention_bias=bool(_get(d, "attention_bias", where, False)),
        )


@dataclass(frozen=True)
class PredictorConfig(TransformerConfig):
    """The code predictor: one head and one embedding per residual codebook group."""

    vocab_size: int = 0  # codebook size
    num_code_groups: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> PredictorConfig:
        base = TransformerConfig.from_dict(d, where)
        return cls(
            **base.__dict__,
            vocab_size=int(_get(d, "vocab_size", where)),
            num_code_groups=int(_get(d, "num_code_groups", where)),
        )


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    vocab_size: int = 0  # codec vocabulary: codebook ids, then control and speaker ids
    text_vocab_size: int = 0
    text_hidden_size: int = 0
    num_code_groups: int = 0
    codec_eos_token_id: int = 0
    codec_think_id: int = 0
    codec_nothink_id: int = 0
    codec_think_bos_id: int = 0
    codec_think_eos_id: int = 0
    codec_pad_id: int = 0
    codec_bos_id: int = 0
    spk_id: Mapping[str, int] | None = None
    spk_is_dialect: Mapping[str, str | bool] | None = None
    codec_language_id: Mapping[str, int] | None = None
    predictor: PredictorConfig | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> TalkerConfig:
        base = TransformerConfig.from_dict(d, where)
        ids = {
            k: int(_get(d, k, where))
            for k in (
                "codec_eos_token_id", "codec_think_id", "codec_nothink_id", "codec_think_bos_id",
                "codec_think_eos_id", "codec_pad_id", "codec_bos_id",
            )
        }
        predictor = PredictorConfig.from_dict(_get(d, "code_predictor_config", where), f"{where}.code_predictor_config")
        cfg = cls(
            **base.__dict__,
            vocab_size=int(_get(d, "vocab_size", where)),
            text_vocab_size=int(_get(d, "text_vocab_size", where)),
            text_hidden_size=int(_get(d, "text_hidden_size", where)),
            num_code_groups=int(_get(d, "num_code_groups", where)),
            spk_id={k.lower(): int(v) for k, v in _get(d, "spk_id", where, {}).items()},
            spk_is_dialect={k.lower(): v for k, v in _get(d, "spk_is_dialect", where, {}).items()},
            codec_language_id={k.lower(): int(v) for k, v in _get(d, "codec_language_id", where, {}).items()},
            predictor=predictor,
            **ids,
        )
        cfg._validate(where)
        return cfg

    def _validate(self, where: str) -> None:
        assert self.predictor is not None and self.spk_id is not None and self.codec_language_id is not None
        if self.predictor.num_code_groups != self.num_code_groups:
            raise ConfigError(
                f"{where}: num_code_groups {self.num_code_groups} != code_predictor_config.num_code_groups "
                f"{self.predictor.num_code_groups}"
            )
        if self.num_code_groups < 2:
            raise ConfigError(f"{where}: num_code_groups must be >= 2")
        if self.vocab_size - CONTROL_BLOCK < self.predictor.vocab_size:
            raise ConfigError(
                f"{where}: vocab_size {self.vocab_size} leaves fewer than the codebook's "
                f"{self.predictor.vocab_size} ids below the {CONTROL_BLOCK}-id control block"
            )
        control = {"codec_eos_token_id": self.codec_eos_token_id, "codec_pad_id": self.codec_pad_id,
                   "codec_bos_id": self.codec_bos_id}
        for name, value in {**control, **{f"spk_id.{k}": v for k, v in self.spk_id.items()},
                            **{f"codec_language_id.{k}": v for k, v in self.codec_language_id.items()}}.items():
            if not 0 <= value < self.vocab_size:
                raise ConfigError(f"{where}: {name} = {value} is outside the codec vocabulary [0, {self.vocab_size})")
        for speaker, dialect in (self.spk_is_dialect or {}).items():
            if dialect and str(dialect).lower() not in self.codec_language_id:
                raise ConfigError(f"{where}: speaker {speaker!r} has dialect {dialect!r} with no codec_language_id")

    @property
    def suppressed_ids(self) -> range:
        return range(self.vocab_size - CONTROL_BLOCK, self.vocab_size)


@dataclass(frozen=True)
class CodecConfig:
    """The 12 Hz speech-tokenizer decoder (codes → 24 kHz waveform)."""

    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    latent_dim: int
    decoder_dim: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    attention_bias: bool
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    sample_rate: int
    samples_per_frame: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> CodecConfig:
        model_type = d.get("model_type")
        if model_type != CODEC_MODEL_TYPE:
            raise ConfigError(f"{where}: model_type {model_type!r} is not {CODEC_MODEL_TYPE!r} (only the 12 Hz tokenizer is served)")
        dec = _get(d, "decoder_config", where)
        w = f"{where}.decoder_config"
        if _get(dec, "hidden_act", w, "silu") != "silu":
            raise ConfigError(f"{w}: hidden_act must be 'silu'")
        hidden = int(_get(dec, "hidden_size", w))
        heads = int(_get(dec, "num_attention_heads", w))
        cfg = cls(
            codebook_size=int(_get(dec, "codebook_size", w)),
            codebook_dim=int(_get(dec, "codebook_dim", w)),
            num_quantizers=int(_get(dec, "num_quantizers", w)),
            latent_dim=int(_get(dec, "latent_dim", w)),
            decoder_dim=int(_get(dec, "decoder_dim", w)),
            hidden_size=hidden,
            intermediate_size=int(_get(dec, "intermediate_size", w)),
            num_hidden_layers=int(_get(dec, "num_hidden_layers", w)),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(dec, "num_key_value_heads", w, heads)),
            head_dim=int(_get(dec, "head_dim", w, hidden // heads)),
            rms_norm_eps=float(_get(dec, "rms_norm_eps", w, 1e-5)),
            rope_theta=float(_get(dec, "rope_theta", w, 10000.0)),
            sliding_window=int(_get(dec, "sliding_window", w)),
            attention_bias=bool(_get(dec, "attention_bias", w, False)),
            upsample_rates=tuple(int(x) for x in _get(dec, "upsample_rates", w)),
            upsampling_ratios=tuple(int(x) for x in _get(dec, "upsampling_ratios", w)),
            sample_rate=int(_get(d, "output_sample_rate", where, 24000)),
            samples_per_frame=int(_get(d, "decode_upsample_rate", where)),
        )
        total = math.prod(cfg.upsample_rates) * math.prod(cfg.upsampling_ratios)
        if total != cfg.samples_per_frame:
            raise ConfigError(f"{where}: decode_upsample_rate {cfg.samples_per_frame} != the decoder's upsampling {total}")
        if cfg.codebook_dim % 2:
            raise ConfigError(f"{w}: codebook_dim must be even (the quantizer works at half of it)")
        return cfg

    def receptive_field_frames(self) -> int:
        """Frames of left context after which a frame's audio no longer changes: with at
        least this much context a chunk decodes exactly like the whole sequence."""
        frames = 2.0 + self.num_hidden_layers * (self.sliding_window - 1)  # pre-conv k3; windows
        rate = 1
        for factor in self.upsampling_ratios:
            rate *= factor
            frames += 6 / rate  # ConvNeXt depthwise k7 (the stride-sized transposed conv adds none)
        frames += 6 / rate  # first decoder conv, k7
        for up in self.upsample_rates:
            frames += 1 / rate  # transposed conv k=2u, s=u: one input sample to the left
            rate *= up
            frames += 6 * (1 + 3 + 9) / rate  # residual units, k7 at dilations 1, 3, 9
        frames += 6 / rate  # output conv, k7
        return math.ceil(frames)


@dataclass(frozen=True)
class SamplingDefaults:
    """``generation_config.json``: the main (first codebook) and code-predictor defaults."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingDefaults:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and d[k] is not None}
        return cls(**known)


@dataclass(frozen=True)
class StreamingConfig:
    chunk: int
    first_chunk: int
    left_context: int  # frames re-decoded before each chunk when not stateful
    stateful: bool = True
    codec_batch: int | None = None
    encoder_batch: int | None = None


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    codec: CodecConfig
    sampling: SamplingDefaults
    streaming: StreamingConfig
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    torch_dtype: str
    tts_model_type: str = CUSTOM_VOICE
    tts_model_size: str = ""
    speaker_encoder: Any = None  # speaker_encoder.SpeakerEncoderConfig, Base checkpoints only

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Qwen3TTSConfig:
        where = "config.json"
        talker = TalkerConfig.from_dict(_get(d, "talker_config", where), f"{where}.talker_config")
        codec = CodecConfig.from_dict(_get(d, "speech_tokenizer", where), "speech_tokenizer/config.json")
        if codec.num_quantizers != talker.num_code_groups:
            raise ConfigError(
                f"speech_tokenizer/config.json: num_quantizers {codec.num_quantizers} != the talker's "
                f"num_code_groups {talker.num_code_groups}"
            )
        if codec.codebook_size != talker.predictor.vocab_size:  # type: ignore[union-attr]
            raise ConfigError("speech_tokenizer/config.json: codebook_size differs from the code predictor's vocab_size")
        stream = {**DEFAULT_STREAMING, **(d.get("mstar_streaming") or {})}
        left = stream["left_context"]
        streaming = StreamingConfig(
            chunk=int(stream["chunk"]),  # type: ignore[arg-type]
            first_chunk=int(stream["first_chunk"]),  # type: ignore[arg-type]
            left_context=codec.receptive_field_frames() if left is None else int(left),
            stateful=bool(stream["stateful"]),
            codec_batch=None if stream["codec_batch"] is None else int(stream["codec_batch"]),  # type: ignore[arg-type]
            encoder_batch=None if stream["encoder_batch"] is None else int(stream["encoder_batch"]),  # type: ignore[arg-type]
        )
        tokens = {
            k: int(_get(d, k, where))
            for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")
        }
        for name, value in tokens.items():
            if not 0 <= value < talker.text_vocab_size:
                raise ConfigError(f"{where}: {name} = {value} is outside the text vocabulary [0, {talker.text_vocab_size})")
        kind = str(d.get("tts_model_type") or CUSTOM_VOICE)
        if kind not in MODEL_TYPES:
            raise ConfigError(f"{where}: tts_model_type {kind!r} is not one of {list(MODEL_TYPES)}")
        if kind == CUSTOM_VOICE and not talker.spk_id:
            raise ConfigError(f"{where}.talker_config: a CustomVoice checkpoint needs speakers (spk_id)")
        speaker_encoder = None
        if kind == BASE:
            from mstar_qwen3tts.speaker_encoder import SpeakerEncoderConfig

            speaker_encoder = SpeakerEncoderConfig.from_dict(_get(d, "speaker_encoder_config", where))
            if speaker_encoder.enc_dim != talker.hidden_size:
                raise ConfigError(f"{where}: speaker_encoder_config.enc_dim {speaker_encoder.enc_dim} != the talker's "
                                  f"hidden_size {talker.hidden_size}")
        return cls(
            talker=talker,
            codec=codec,
            sampling=SamplingDefaults.from_dict(d.get("generation") or {}),
            streaming=streaming,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            tts_model_type=kind,
            tts_model_size=str(d.get("tts_model_size") or ""),
            speaker_encoder=speaker_encoder,
            **tokens,
        )

    @property
    def supports_instructions(self) -> bool:
        """VoiceDesign always; CustomVoice except 0.6B, where qwen-tts drops the instruct (its
        test is ``tts_model_size in "0b6"``, which a missing size also passes); Base never."""
        return self.tts_model_type == VOICE_DESIGN or (
            self.tts_model_type == CUSTOM_VOICE and self.tts_model_size not in "0b6")

    @property
    def speakers(self) -> list[str]:
        assert self.talker.spk_id is not None
        return list(self.talker.spk_id)

    @property
    def languages(self) -> list[str]:
        """What a request may name: ``auto`` and every non-dialect language (as qwen-tts)."""
        assert self.talker.codec_language_id is not None
        return ["auto", *(k for k in self.talker.codec_language_id if "dialect" not in k)]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"Qwen3-TTS checkpoint is missing {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The three JSON files of the checkpoint merged into one dict (validated)."""
    root = Path(checkpoint_dir)
    config = _read_json(root / "config.json")
    if ARCHITECTURE not in (config.get("architectures") or []) and config.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"{root}/config.json is not a Qwen3-TTS checkpoint (architectures: {config.get('architectures')})")
    kind = config.get("tts_model_type")
    if kind not in MODEL_TYPES:
        raise ConfigError(f"{root}/config.json: tts_model_type {kind!r} is not one of {list(MODEL_TYPES)}")
    gen_path = root / "generation_config.json"
    config["generation"] = _read_json(gen_path) if gen_path.is_file() else {}
    config["speech_tokenizer"] = _read_json(root / "speech_tokenizer" / "config.json")
    Qwen3TTSConfig.from_dict(config)  # fail at load time, naming the file and key
    return config
