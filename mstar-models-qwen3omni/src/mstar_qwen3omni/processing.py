"""Chat messages with media -> prompt ids + the processor tensors the Thinker takes, through
transformers' own ``Qwen3OmniMoeProcessor`` (its chat template, the ``WhisperFeatureExtractor``
for audio, the Pillow ``Qwen2VLImageProcessorPil`` for images, and its prompt expansion, including
audio interleaved with video). Only the video pixels go through our ``VideoFrameProcessor``
(plain torch, equal to transformers' torchvision one; see ``media_video``).

    pre = Preprocessor.from_checkpoint(ckpt_dir, MediaLimits(allowed_domains=(...)))
    out = pre(messages, use_audio_in_video=False)
    out.input_ids          # list[int], the whole prompt with media placeholders expanded
    out.tensors            # dict: pixel_values, image_grid_thw, pixel_values_videos,
                           # video_grid_thw, video_second_per_grid, input_features,
                           # feature_attention_mask (only those the messages need)

``messages`` are OpenAI chat messages; content is a string or a list of parts: ``text``,
``image_url`` ({"url"}), ``input_audio`` ({"data", "format"}), ``audio_url`` ({"url"}),
``video_url`` ({"url"}), or the native ``image`` / ``audio`` / ``video`` with a URL or base64
string. URLs are ``data:`` URLs, base64, or ``http(s)`` on allowed hosts.
Every problem with a part is a ``ValueError`` naming it, e.g.
``messages[0].content[1] (image_url): not a decodable image``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .media import MediaBudget, MediaLimits, decode_audio, decode_image, decode_video, fetch_bytes
from .media_video import VideoFrameProcessor

# OpenAI / vLLM content parts, and the native ones ({"type": "image", "image": url-or-base64}).
MEDIA_PARTS = {
    "image_url": "image", "input_audio": "audio", "audio_url": "audio", "video_url": "video",
    "image": "image", "audio": "audio", "video": "video",
}


@dataclass
class ProcessedPrompt:
    input_ids: list[int]
    tensors: dict[str, torch.Tensor]


def _processor_class() -> type:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    class Qwen3OmniProcessor(Qwen3OmniMoeProcessor):
        """transformers' processor, unchanged but for how its constructor finds the video
        processor's base class: through transformers' top-level module, which without torchvision
        offers only a placeholder. The check itself (an instance of ``VideoProcessorMixin``) stays."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor":
                if not isinstance(argument, VideoProcessorMixin):
                    raise TypeError(f"video_processor must be a VideoProcessorMixin, got {type(argument).__name__}")
                return VideoProcessorMixin
            return super().check_argument_for_proper_class(argument_name, argument)

    return Qwen3OmniProcessor


def build_hf_processor(checkpoint_dir: str | Path):
    """transformers' ``Qwen3OmniMoeProcessor`` from the checkpoint's tokenizer files, chat template
    and preprocessing configs, each found where transformers finds it (the template through core's
    one lookup, in the processor's file order; the image, video and audio configs in
    ``processor_config.json`` or their own files, ``mstar.processor_config``)."""
    from mstar.processor_config import processor_config
    from mstar.text import load_tokenizer
    from mstar.text.chat_template import find_chat_template
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    root = Path(checkpoint_dir)
    image_config = processor_config(root, "image_processor") or {}
    video_config = processor_config(root, "video_processor") or image_config
    feature_config = processor_config(root, "feature_extractor")
    if feature_config is None:
        raise FileNotFoundError(f"{root} has no audio feature extractor config (preprocessor_config.json or processor_config.json)")
    return _processor_class()(
        image_processor=Qwen2VLImageProcessorPil(**_image_kwargs(image_config)),
        video_processor=VideoFrameProcessor.from_config(video_config),
        feature_extractor=WhisperFeatureExtractor.from_dict(feature_config),
        tokenizer=load_tokenizer(root, "processor"),
        chat_template=find_chat_template(root, "processor"),
    )


_IMAGE_KEYS = (
    "size", "min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size",
    "image_mean", "image_std", "do_resize", "do_rescale", "rescale_factor", "do_normalize",
    "do_convert_rgb", "resample",
)


def _image_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in _IMAGE_KEYS if k in config}


class Preprocessor:
    def __init__(self, hf_processor: Any, limits: MediaLimits, video_fps: float = 2.0) -> None:
        self.hf = hf_processor
        self.limits = limits
        self.video_fps = video_fps
        self.audio_rate = int(hf_processor.feature_extractor.sampling_rate)
        # The feature extractor's STFT window: shorter audio fails inside it (a reflect pad
        # wider than the input), so it is refused here, naming the part.
        self.min_audio_samples = int(getattr(hf_processor.feature_extractor, "n_fft", 1))

    def _long_enough(self, wave: Any, name: str) -> Any:
        if len(wave) < self.min_audio_samples:
            raise ValueError(f"{name}: audio of {len(wave)} samples at {self.audio_rate} Hz is shorter than the "
                             f"{self.min_audio_samples}-sample window the audio features need")
        return wave

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, limits: MediaLimits | None = None, video_fps: float = 2.0) -> Preprocessor:
        return cls(build_hf_processor(checkpoint_dir), limits or MediaLimits(), video_fps)

    def __call__(
        self, messages: list[dict[str, Any]], use_audio_in_video: bool = False, add_generation_prompt: bool = True
    ) -> ProcessedPrompt:
        images: list[Any] = []
        videos: list[Any] = []
        audio: list[Any] = []
        audio_from_video: list[int | None] = []  # per audio slot: None, or the video it came from
        templated: list[dict[str, Any]] = []
        budget = MediaBudget(self.limits)  # this request's parts, pixels and audio seconds
        for m, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                templated.append(message)
                continue
            parts = []
            for p, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                name = f"messages[{m}].content[{p}] ({kind})"
                if kind == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
                    continue
                if kind not in MEDIA_PARTS:
                    raise ValueError(f"{name}: unsupported content part type")
                modality = MEDIA_PARTS[kind]
                budget.add_part(name)
                data, fmt = self._source(part, kind, name)
                if modality == "image":
                    images.append(decode_image(data, self.limits, name, budget))
                elif modality == "audio":
                    audio.append(self._long_enough(decode_audio(data, self.limits, name, self.audio_rate, fmt, budget), name))
                    audio_from_video.append(None)
                else:
                    video = decode_video(
                        data,
                        self.limits,
                        name,
                        fps=self.video_fps,
                        temporal_patch_size=self.hf.video_processor.temporal_patch_size,
                        audio_rate=self.audio_rate if use_audio_in_video else None,
                        budget=budget,
                    )
                    videos.append(video.frames)
                    if video.audio is not None and video.audio.size:
                        audio.append(self._long_enough(video.audio, f"{name} audio track"))
                        audio_from_video.append(len(videos) - 1)
                parts.append({"type": modality})
            templated.append({**message, "content": parts})
        return self.process_decoded(templated, images, videos, audio, audio_from_video, add_generation_prompt)

    def process_decoded(
        self,
        messages: list[dict[str, Any]],
        images: list[Any],
        videos: list[Any],
        audio: list[Any],
        audio_from_video: list[int | None],
        add_generation_prompt: bool = True,
    ) -> ProcessedPrompt:
        """Already decoded media (in order of appearance) + messages whose media parts are
        ``{"type": "image" | "audio" | "video"}`` -> prompt ids and tensors."""
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        kwargs: dict[str, Any] = {"return_tensors": "pt"}
        if videos:
            kwargs["fps"] = self.video_fps
        if any(i is not None for i in audio_from_video):
            kwargs["load_audio_from_video"] = True
            kwargs["audio_from_video_indices"] = audio_from_video
        out = self.hf(
            text=[text],
            images=images or None,
            videos=videos or None,
            audio=audio or None,
            **kwargs,
        )
        tensors = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        return ProcessedPrompt(out["input_ids"][0].tolist(), tensors)

    def _source(self, part: dict[str, Any], kind: str, name: str) -> tuple[bytes, str | None]:
        """The part's encoded bytes and declared format: ``input_audio`` carries ``{data, format}``,
        the ``*_url`` parts ``{url}`` (or the URL string), the native parts a URL or base64 string."""
        payload = part.get(kind)
        fmt = None
        if kind == "input_audio":
            if not isinstance(payload, dict):
                raise ValueError(f"{name}: missing the 'input_audio' object")
            source, fmt = payload.get("data"), payload.get("format")
        else:
            source = payload.get("url") if isinstance(payload, dict) else payload
        if not isinstance(source, str) or not source:
            raise ValueError(f"{name}: missing the media data or URL")
        return fetch_bytes(source, self.limits, name), fmt


def write_preprocessor_config(
    root: str | Path,
    *,
    patch_size: int,
    temporal_patch_size: int,
    merge_size: int,
    num_mel_bins: int,
    min_pixels: int,
    max_pixels: int,
) -> None:
    """``preprocessor_config.json`` for a tiny checkpoint, in the released file's shape (one file
    for the feature extractor, the image processor and the video processor)."""
    config = {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": num_mel_bins,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 300,
        "n_fft": 400,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 3,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "patch_size": patch_size,
        "temporal_patch_size": temporal_patch_size,
        "merge_size": merge_size,
    }
    (Path(root) / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
