"""Voice-clone prompts of Base checkpoints: reference audio (+ transcript) → tensors.

A clone prompt is what qwen-tts's ``create_voice_clone_prompt`` computes, as three tensors
(``ClonePrompt.tensors()``; names are stable: saved voices store exactly these):

* ``speaker_embed`` float32 [D] (D = the talker's hidden size): the speaker encoder's
  x-vector of the reference audio resampled to 24 kHz. Always present.
* ``ref_codes`` int64 [T, G]: the 12 Hz speech tokenizer's encoding of the reference audio
  (T frames of G codebooks). Shape [0, G] in ``x_vector_only_mode``.
* ``ref_text_ids`` int64 [N]: the reference transcript's text token ids (the tokens between
  ``<|im_start|>assistant\\n`` and ``<|im_end|>\\n``, tokenized as qwen-tts does, on their
  own). Shape [0] in ``x_vector_only_mode``.

``x_vector_only_mode`` is therefore ``ref_codes.shape[0] == 0``. In-context mode (false)
needs a transcript: without one ``CloneEncoder.encode`` raises ``CloneError(param="ref_text")``.

    encoder = CloneEncoder.from_checkpoint(ckpt_dir)          # Base checkpoints only
    wave, rate = read_audio(raw_bytes)                          # CloneError(param="ref_audio") if bad
    prompt = encoder.encode(wave, rate, ref_text="Hi there.", x_vector_only_mode=False)
    save_file(prompt.tensors(), path); ClonePrompt.from_tensors(load_file(path))

``CloneEncoder.from_checkpoint`` loads the speaker encoder, the speech tokenizer's encoder
(``codec_encoder``, for ``ref_codes``) and the text tokenizer, to compute a prompt in
process (scripts, tests). Both encoders run on the reference audio resampled (soxr HQ, as
librosa does for qwen-tts) to their 24 kHz; ``reference_features`` is that cheap share (the
server's preprocess pool computes it and the engine's encoder nodes do the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ASSISTANT_ROLE_TOKENS = 3  # "<|im_start|>", "assistant", "\n"
REF_TAIL_TOKENS = 2  # "<|im_end|>", "\n"


class CloneError(ValueError):
    """Bad reference audio or transcript; ``param`` is the request field to name in a 400."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def ref_text_prompt(text: str) -> str:
    """The reference transcript as qwen-tts tokenizes it."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


@dataclass(frozen=True)
class ClonePrompt:
    speaker_embed: torch.Tensor  # float32 [D]
    ref_codes: torch.Tensor  # int64 [T, G]; [0, G] in x_vector_only_mode
    ref_text_ids: torch.Tensor  # int64 [N]; [0] in x_vector_only_mode

    @property
    def x_vector_only_mode(self) -> bool:
        return self.ref_codes.shape[0] == 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"speaker_embed": self.speaker_embed, "ref_codes": self.ref_codes, "ref_text_ids": self.ref_text_ids}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> ClonePrompt:
        missing = {"speaker_embed", "ref_codes", "ref_text_ids"} - tensors.keys()
        if missing:
            raise ValueError(f"a clone prompt needs tensors {sorted(missing)}")
        spk = tensors["speaker_embed"].to(torch.float32).reshape(-1)
        codes = tensors["ref_codes"].to(torch.long)
        ids = tensors["ref_text_ids"].to(torch.long).reshape(-1)
        if codes.dim() != 2:
            raise ValueError(f"ref_codes must be [frames, groups], got {tuple(codes.shape)}")
        if codes.shape[0] and not ids.numel():
            raise ValueError("an in-context clone prompt (ref_codes) needs ref_text_ids")
        return cls(spk, codes, ids)


def read_audio(data: bytes, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Encoded audio (anything libsndfile reads: wav, flac, ogg, ...) → (float32 mono, rate).
    Channels are averaged as qwen-tts does. The length (``max_seconds``) and the sample rate
    are checked from the header before decoding, and the length again while decoding in
    blocks (``mstar.api.audio_input``): a small file never decodes to more than that."""
    from mstar.api.audio_input import AudioInputError, read_mono

    try:
        wave, rate = read_mono(data, float("inf") if max_seconds is None else max_seconds)
    except AudioInputError as exc:
        raise CloneError(f"ref_audio: {exc}", "ref_audio") from None
    if wave.shape[0] == 0:
        raise CloneError("ref_audio holds no samples", "ref_audio")
    return wave, rate


def resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """soxr at its high quality, the resampler ``librosa.resample`` uses by default (qwen-tts's)."""
    if rate == target:
        return wave.astype(np.float32, copy=False)
    import soxr

    return soxr.resample(wave.astype(np.float32, copy=False), rate, target, quality="HQ").astype(np.float32, copy=False)


class CloneEncoder:
    """The Base checkpoint's speaker encoder (+ the speech tokenizer's encoder, when
    loaded) and the text tokenizer: everything a clone prompt needs, on one device."""

    def __init__(self, speaker_encoder: Any, tokenize: Callable[[str], list[int]], num_code_groups: int,
                 codec_encoder: Any | None = None, codec_rate: int = 24000) -> None:
        self.speaker_encoder = speaker_encoder
        self.tokenize = tokenize
        self.num_code_groups = num_code_groups
        self.codec_encoder = codec_encoder
        self.codec_rate = codec_rate

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path, device: str = "cpu") -> CloneEncoder:
        from mstar_qwen3tts.clone_loading import load_clone_models

        m = load_clone_models(Path(checkpoint_dir), device)
        return cls(m.speaker_encoder, m.tokenize, m.num_code_groups, m.codec_encoder, m.codec_rate)

    def encode(self, wave: np.ndarray, sample_rate: int, ref_text: str | None = None,
               x_vector_only_mode: bool = False) -> ClonePrompt:
        """``wave``: float32 mono samples at ``sample_rate``."""
        if not x_vector_only_mode and self.codec_encoder is None:
            raise CloneError("in-context cloning needs the speech tokenizer's encoder, which is not loaded; "
                             "use x_vector_only_mode", "x_vector_only_mode")
        feats = reference_features(wave, sample_rate, self.speaker_encoder.cfg.sample_rate, self.codec_rate, ref_text,
                                   x_vector_only_mode)
        with torch.inference_mode():
            device = self.speaker_encoder.fc.weight.device
            speaker = self.speaker_encoder(feats.mel[None].to(device))[0].float().cpu()
        if x_vector_only_mode:
            empty = torch.zeros(0, self.num_code_groups, dtype=torch.long)
            return ClonePrompt(speaker, empty, torch.zeros(0, dtype=torch.long))
        assert feats.wave is not None and ref_text is not None
        codes = self.codec_encoder.encode(feats.wave).cpu()
        return ClonePrompt(speaker, codes.to(torch.long), torch.tensor(self.ref_text_ids(ref_text), dtype=torch.long))

    def ref_text_ids(self, ref_text: str) -> list[int]:
        return transcript_ids(self.tokenize, ref_text)


def transcript_ids(tokenize: Callable[[str], list[int]], ref_text: str) -> list[int]:
    """The reference transcript's ids (``ref_text_prompt`` without its role and tail)."""
    ids = tokenize(ref_text_prompt(ref_text))[ASSISTANT_ROLE_TOKENS:-REF_TAIL_TOKENS]
    if not ids:
        raise CloneError("ref_text is empty", "ref_text")
    return ids


@dataclass(frozen=True)
class ReferenceFeatures:
    """The cheap CPU share of a clone (preprocess pool): the clip's log-mel features for the
    speaker encoder and, in-context, the clip at the speech tokenizer's rate."""

    mel: torch.Tensor  # float32 [frames, mel_dim], at the speaker encoder's rate
    wave: torch.Tensor | None  # float32 [samples] at the codec rate; None in x_vector_only_mode


def reference_features(wave: np.ndarray, sample_rate: int, speaker_rate: int, codec_rate: int, ref_text: str | None,
                       x_vector_only_mode: bool) -> ReferenceFeatures:
    """Checks the clip (and that in-context mode has a transcript), resamples it and computes
    its log-mel features; bad input is a ``CloneError`` naming the field."""
    from mstar_qwen3tts.speaker_encoder import log_mel

    if wave.ndim != 1 or wave.size == 0:
        raise CloneError("ref_audio must be non-empty mono audio", "ref_audio")
    if not np.isfinite(wave).all():
        raise CloneError("ref_audio holds non-finite samples", "ref_audio")
    if not x_vector_only_mode and not ref_text:
        raise CloneError("ref_text (the reference audio's transcript) is required unless x_vector_only_mode is true",
                         "ref_text")
    spk_wave = torch.from_numpy(resample(wave, sample_rate, speaker_rate))
    if spk_wave.numel() < 1024:  # the mel front end's window
        raise CloneError("ref_audio is too short", "ref_audio")
    mel = log_mel(spk_wave[None], speaker_rate)[0]
    codec_wave = None if x_vector_only_mode else torch.from_numpy(resample(wave, sample_rate, codec_rate))
    return ReferenceFeatures(mel, codec_wave)
