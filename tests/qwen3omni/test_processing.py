"""Chat messages with media (data URLs / base64) through our Preprocessor give exactly the
prompt ids and integer tensors, and float tensors within 1e-5 (their last bits vary by CPU),
that transformers' Qwen3OmniMoeProcessor (torchvision video processor included) produced for
the same media and messages. The reference outputs were made in a throw-away environment by
mstar-models-qwen3omni/tools/make_processor_fixtures.py."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import torch
from mstar_qwen3omni.media import MediaLimits
from mstar_qwen3omni.processing import Preprocessor, write_preprocessor_config
from mstar_qwen3omni.tiny_tokenizer import write_tokenizer
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "processor"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
MIME = {".png": "image/png", ".mp4": "video/mp4", ".wav": "audio/wav"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("processor_ckpt")
    write_tokenizer(root)
    write_preprocessor_config(root, **EXPECTED["preprocessor"])
    return root


@pytest.fixture(scope="module")
def preprocessor(checkpoint) -> Preprocessor:
    return Preprocessor.from_checkpoint(checkpoint, MediaLimits(), video_fps=EXPECTED["fps"])


def _inline(messages: list[dict]) -> list[dict]:
    """Replace the fixtures' ``file:NAME`` references by data URLs (bare base64 for input_audio)."""

    def encode(ref: str, data_url: bool) -> str:
        path = FIXTURES / ref.removeprefix("file:")
        b64 = base64.b64encode(path.read_bytes()).decode()
        return f"data:{MIME[path.suffix]};base64,{b64}" if data_url else b64

    out = []
    for message in messages:
        if isinstance(message["content"], list):
            parts = []
            for part in message["content"]:
                kind = part["type"]
                if kind in ("image_url", "video_url"):
                    part = {"type": kind, kind: {"url": encode(part[kind]["url"], True)}}
                elif kind == "input_audio":
                    part = {"type": kind, kind: {**part[kind], "data": encode(part[kind]["data"], False)}}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out


def test_the_tokenizer_is_the_one_the_fixtures_were_made_with(checkpoint):
    assert hashlib.sha256((checkpoint / "tokenizer.json").read_bytes()).hexdigest() == EXPECTED["tokenizer_json_sha256"]


@pytest.mark.parametrize("case", sorted(EXPECTED["cases"]))
def test_prompt_ids_and_every_tensor_equal_transformers(preprocessor, case):
    spec = EXPECTED["cases"][case]
    got = preprocessor(_inline(spec["messages"]), use_audio_in_video=spec["use_audio_in_video"])
    assert got.input_ids == spec["input_ids"]
    rows = load_file(str(FIXTURES / "expected.safetensors"))
    assert sorted(got.tensors) == sorted(spec["tensors"])
    for key, meta in spec["tensors"].items():
        value = torch.as_tensor(got.tensors[key]).contiguous()
        assert list(value.shape) == meta["shape"], key
        assert str(value.dtype) == meta["dtype"], key
        stored = rows[f"{case}.{key}"]
        sampled = value[:: EXPECTED["row_stride"]] if stored.shape != value.shape else value
        if value.is_floating_point():
            # Float features (the log-mel's FFT) differ in their last bits between CPUs
            # (SIMD kernels): the fixtures' machine and this one need not match bit for bit.
            torch.testing.assert_close(sampled, stored, rtol=1e-5, atol=1e-5, msg=key)
        else:
            assert torch.equal(sampled, stored), key
            assert hashlib.sha256(value.numpy().tobytes()).hexdigest() == meta["sha256"], key


# --- media decoding and limits -------------------------------------------------------------


def _data_url(name: str) -> str:
    path = FIXTURES / name
    return f"data:{MIME[path.suffix]};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": url}}]}]


def _run(pre: Preprocessor, messages: list[dict], limits: MediaLimits | None = None, **kwargs):
    return Preprocessor(pre.hf, limits or pre.limits, pre.video_fps)(messages, **kwargs)


@pytest.mark.parametrize(
    ("messages", "limits", "needle"),
    [
        (_image_message("data:image/png;base64," + base64.b64encode(b"not a png at all").decode()), None, "not a decodable image"),
        (_image_message("data:image/png;base64,@@@"), None, "not valid base64"),
        (_image_message(_data_url("a.png")), MediaLimits(max_image_pixels=50 * 70 - 1), "over the limit of 3499"),
        (_image_message(_data_url("a.png")), MediaLimits(max_bytes=1000), "over the limit of 1000 bytes"),
        (_image_message("https://example.com/cat.png"), None, "not in the allowed media domains"),
        (_image_message("https://evil.example.org/cat.png"), MediaLimits(allowed_domains=("example.com",)), "'evil.example.org' is not in"),
        (_image_message("file:///etc/passwd"), MediaLimits(allowed_domains=("localhost",)), "scheme 'file' is not allowed"),
    ],
)
def test_a_bad_image_part_is_a_value_error_naming_it(preprocessor, messages, limits, needle):
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[1\] \(image_url\): ") as err:
        _run(preprocessor, messages, limits)
    assert needle in str(err.value)


def _audio_message(name: str, fmt: str) -> list[dict]:
    data = base64.b64encode((FIXTURES / name).read_bytes()).decode()
    return [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": fmt}}]}]


def test_audio_in_the_wrong_format_or_too_long_is_refused(preprocessor):
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[0\] \(input_audio\): declared format 'mp3' but the data is wav"):
        _run(preprocessor, _audio_message("tone.wav", "mp3"))
    with pytest.raises(ValueError, match=r"content\[0\] \(input_audio\): audio is 1.3 s, over the limit of 1.0 s"):
        _run(preprocessor, _audio_message("tone.wav", "wav"), MediaLimits(max_audio_seconds=1.0))


def test_video_limits_on_seconds_and_frames(preprocessor):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": _data_url("clip.mp4")}}]}]
    with pytest.raises(ValueError, match=r"content\[0\] \(video_url\): video samples over the limit of 3 frames"):
        _run(preprocessor, messages, MediaLimits(max_video_frames=3))
    with pytest.raises(ValueError, match=r"content\[0\] \(video_url\): video is over the limit of 1.0 s"):
        _run(preprocessor, messages, MediaLimits(max_video_seconds=1.0))
    corrupt = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(b"\0" * 64).decode()}}]}]
    with pytest.raises(ValueError, match=r"content\[0\] \(video_url\): "):
        _run(preprocessor, corrupt)


def test_video_frames_over_the_pixel_limit_and_empty_audio_are_refused(preprocessor):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": _data_url("clip.mp4")}}]}]
    with pytest.raises(ValueError, match=r"content\[0\] \(video_url\): video frames are 64x48 = 3072 pixels, over the limit of 3000"):
        _run(preprocessor, messages, MediaLimits(max_image_pixels=3000))
    import io

    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(0, np.float32), 16000, format="WAV")
    empty = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": base64.b64encode(buf.getvalue()).decode(), "format": "wav"}}]}]
    with pytest.raises(ValueError, match=r"content\[0\] \(input_audio\): audio has no samples"):
        _run(preprocessor, empty)


def test_native_parts_and_url_strings_equal_the_openai_parts(preprocessor):
    url = _data_url("a.png")
    b64 = url.split(",", 1)[1]
    text = {"type": "text", "text": "Hi"}
    openai = _run(preprocessor, _image_message(url))
    for part in ({"type": "image", "image": b64}, {"type": "image", "image": url}, {"type": "image_url", "image_url": url}):
        got = _run(preprocessor, [{"role": "user", "content": [text, part]}])
        assert got.input_ids == openai.input_ids
        assert torch.equal(got.tensors["pixel_values"], openai.tensors["pixel_values"])


def test_unknown_part_type_is_named(preprocessor):
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "file", "file": {}}]}]
    with pytest.raises(ValueError, match=r"^messages\[0\]\.content\[1\] \(file\): unsupported content part type"):
        _run(preprocessor, messages)


def test_audio_at_another_rate_is_resampled_to_16k_mono():
    import io

    import numpy as np
    import soundfile as sf
    from mstar_qwen3omni.media import decode_audio

    rate = 24000
    t = np.arange(rate) / rate
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 440 * t)], axis=1) * 0.5
    buf = io.BytesIO()
    sf.write(buf, stereo, rate, format="FLAC")
    wave = decode_audio(buf.getvalue(), MediaLimits(), "part", rate=16000, fmt="flac")
    assert wave.dtype == np.float32 and wave.ndim == 1 and abs(wave.size - 16000) <= 1
    spectrum = np.abs(np.fft.rfft(wave))
    assert abs(np.argmax(spectrum) * 16000 / wave.size - 440) < 2
    assert abs(np.abs(wave[1000:-1000]).max() - 0.5) < 0.01


def test_an_allowed_host_is_fetched_and_equals_the_data_url(preprocessor):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = (FIXTURES / "a.png").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/away":
                self.send_response(302)
                self.send_header("Location", "http://example.com/a.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/a.png"
        fetched = _run(preprocessor, _image_message(url), MediaLimits(allowed_domains=("127.0.0.1",)))
        with pytest.raises(ValueError, match="not in the allowed media domains"):
            _run(preprocessor, _image_message(url))  # no allow-list: refused
        away = url.replace("/a.png", "/away")
        with pytest.raises(ValueError, match=r"content\[1\] \(image_url\): remote URL host 'example.com' is not in"):
            _run(preprocessor, _image_message(away), MediaLimits(allowed_domains=("127.0.0.1",)))
    finally:
        server.shutdown()
        server.server_close()
    inline = _run(preprocessor, _image_message(_data_url("a.png")))
    assert fetched.input_ids == inline.input_ids
    assert torch.equal(fetched.tensors["pixel_values"], inline.tensors["pixel_values"])
