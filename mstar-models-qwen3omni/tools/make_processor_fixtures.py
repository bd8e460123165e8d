"""Makes tests/qwen3omni/fixtures/processor: small media files, OpenAI-style chat messages that
use them, and what transformers' Qwen3OmniMoeProcessor (with its torchvision video processor)
produces for each: prompt ids and every processor tensor. Large tensors are stored as a SHA-256
of their bytes plus every 16th row.

The project's environment cannot run transformers' video processor (torchvision wheels from the
registry do not load beside the pinned CPU torch), so run this in a throw-away venv:

    python3 -m venv /tmp/h3ref
    /tmp/h3ref/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 Pillow av soundfile
    /tmp/h3ref/bin/python mstar-models-qwen3omni/tools/make_processor_fixtures.py tests/qwen3omni/fixtures/processor

Media are decoded here the plain way (Pillow, soundfile, PyAV: every frame of a 2 fps video, the
audio track resampled by FFmpeg to 16 kHz mono); the processor gets ``fps=2.0``.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "mstar-models-qwen3omni" / "src"))

from mstar_qwen3omni.processing import write_preprocessor_config  # noqa: E402
from mstar_qwen3omni.tiny_tokenizer import write_tokenizer  # noqa: E402

FPS = 2
RATE = 16000
PREPROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2, num_mel_bins=128, min_pixels=32 * 32, max_pixels=96 * 96)
ROW_STRIDE = 16


def _pattern(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth colour pattern plus noise (smooth so lossy codecs keep it recognisable)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 / width), (y * 255 / height), ((x + y) * 127 / (width + height))], axis=-1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def _png(height: int, width: int, seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_pattern(height, width, seed)).save(buf, format="PNG")
    return buf.getvalue()


def _tone(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * (220 + 200 * t) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _wav(seconds: float, seed: int) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, _tone(seconds, seed), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _mp4(frames: int, height: int, width: int, seed: int, audio_seconds: float | None) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        video = out.add_stream("mpeg4", rate=FPS)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.time_base = Fraction(1, FPS)
        audio = None
        if audio_seconds is not None:
            audio = out.add_stream("aac", rate=RATE, layout="mono")
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(_pattern(height, width, seed + i), format="rgb24")
            frame.pts = i
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if audio is not None:
            wave = _tone(audio_seconds, seed)
            step = 1024
            for start in range(0, wave.size, step):
                chunk = wave[start : start + step]
                frame = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
                frame.sample_rate = RATE
                frame.pts = start
                for packet in audio.encode(frame):
                    out.mux(packet)
            for packet in audio.encode():
                out.mux(packet)
    return buf.getvalue()


def _decode_video(data: bytes, with_audio: bool) -> tuple[np.ndarray, np.ndarray | None]:
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        frames = frames[: len(frames) // 2 * 2]
        wave = None
        if with_audio:
            container.seek(0)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
            chunks = [o.to_ndarray().reshape(-1) for f in container.decode(audio=0) for o in resampler.resample(f)]
            chunks += [o.to_ndarray().reshape(-1) for o in resampler.resample(None)]
            wave = np.concatenate(chunks).astype(np.float32)
    return np.stack(frames), wave


def _reference_processor(root: Path):
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    config = json.loads((root / "preprocessor_config.json").read_text())
    vision_keys = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "resample")
    vision = {k: config[k] for k in vision_keys}
    tokenizer = AutoTokenizer.from_pretrained(root)
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessorPil(**vision),
        video_processor=Qwen2VLVideoProcessor(**vision),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(root),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def _cases() -> dict[str, dict]:
    """name -> messages (media parts name a fixture file) and use_audio_in_video."""
    def img(name: str) -> dict:
        return {"type": "image_url", "image_url": {"url": f"file:{name}"}}

    return {
        "image": {"messages": [{"role": "user", "content": [img("a.png"), {"type": "text", "text": "What is in this picture?"}]}]},
        "two_images": {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [img("a.png"), {"type": "text", "text": "Describe it."}]},
                {"role": "assistant", "content": "A cat sits on a mat."},
                {"role": "user", "content": [{"type": "text", "text": "And this one?"}, img("b.png")]},
            ]
        },
        "audio": {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "file:tone.wav", "format": "wav"}},
                        {"type": "text", "text": "Describe the audio clip."},
                    ],
                }
            ]
        },
        "video": {
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "file:clip.mp4"}}, {"type": "text", "text": "What happens?"}]}]
        },
        "video_with_audio": {
            "use_audio_in_video": True,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hello!"},
                        {"type": "video_url", "video_url": {"url": "file:clip_audio.mp4"}},
                        {"type": "input_audio", "input_audio": {"data": "file:tone.wav", "format": "wav"}},
                    ],
                }
            ],
        },
    }


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    media = {
        "a.png": _png(50, 70, 1),
        "b.png": _png(90, 40, 2),
        "tone.wav": _wav(1.3, 3),
        "clip.mp4": _mp4(5, 48, 64, 4, None),
        "clip_audio.mp4": _mp4(6, 40, 72, 5, 2.6),
    }
    for name, data in media.items():
        (out_dir / name).write_bytes(data)

    import soundfile as sf
    from PIL import Image
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    summary: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tokenizer(root)
        write_preprocessor_config(root, **PREPROCESSOR)
        processor = _reference_processor(root)
        tokenizer_sha = hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest()
        for case, spec in _cases().items():
            use_audio_in_video = spec.get("use_audio_in_video", False)
            images, videos, audio, audio_from_video, templated = [], [], [], [], []
            for message in spec["messages"]:
                if isinstance(message["content"], str):
                    templated.append(message)
                    continue
                parts = []
                for part in message["content"]:
                    kind = part["type"]
                    if kind == "text":
                        parts.append(part)
                    elif kind == "image_url":
                        images.append(Image.open(io.BytesIO(media[part["image_url"]["url"][5:]])).convert("RGB"))
                        parts.append({"type": "image"})
                    elif kind == "input_audio":
                        wave, rate = sf.read(io.BytesIO(media[part["input_audio"]["data"][5:]]), dtype="float32")
                        assert rate == RATE
                        audio.append(wave)
                        audio_from_video.append(None)
                        parts.append({"type": "audio"})
                    elif kind == "video_url":
                        frames, wave = _decode_video(media[part["video_url"]["url"][5:]], use_audio_in_video)
                        videos.append(frames)
                        if wave is not None:
                            audio.append(wave)
                            audio_from_video.append(len(videos) - 1)
                        parts.append({"type": "video"})
                templated.append({**message, "content": parts})
            text = processor.apply_chat_template(templated, tokenize=False, add_generation_prompt=True)
            kwargs = {"fps": float(FPS)} if videos else {}
            if use_audio_in_video:
                kwargs |= {"load_audio_from_video": True, "audio_from_video_indices": audio_from_video}
            out = processor(text=[text], images=images or None, videos=videos or None, audio=audio or None, return_tensors="pt", **kwargs)
            entry = {"input_ids": out["input_ids"][0].tolist(), "tensors": {}}
            for key, value in out.items():
                if key in ("input_ids", "attention_mask"):
                    continue
                value = torch.as_tensor(value).contiguous()
                entry["tensors"][key] = {"shape": list(value.shape), "dtype": str(value.dtype), "sha256": hashlib.sha256(value.numpy().tobytes()).hexdigest()}
                tensors[f"{case}.{key}"] = value[::ROW_STRIDE].contiguous() if value.ndim == 2 and value.shape[0] > 64 else value
            summary[case] = {"messages": spec["messages"], "use_audio_in_video": use_audio_in_video, **entry}
    save_file(tensors, str(out_dir / "expected.safetensors"))
    meta = {"tokenizer_json_sha256": tokenizer_sha, "preprocessor": PREPROCESSOR, "fps": FPS, "row_stride": ROW_STRIDE, "cases": summary}
    (out_dir / "expected.json").write_text(json.dumps(meta, indent=1))
    for case, entry in summary.items():
        print(case, len(entry["input_ids"]), {k: v["shape"] for k, v in entry["tensors"].items()})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
