"""``mstar serve --model qwen3omni --weights DIR`` over HTTP with the official openai client, DIR
the plugin's tiny checkpoint in the layout ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` ships (template
only in ``chat_template.json``, ``vocab.json`` + ``merges.txt``, no end id in
``generation_config.json``, sharded weights: the server must warm up on it): a text chat equal
to transformers' greedy generate token for token, image + text, audio + text and video (with
and without its audio track) chats (whole and streamed), a seeded sampled multimodal request
alone and inside a batch of 8 mixed requests, and bad media parts as 400s naming the part
while the server keeps serving."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import httpx
import openai
import pytest
import torch
from omni_server import omni_server

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).parent / "fixtures" / "processor"


def _data_url(name: str, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode((FIXTURES / name).read_bytes()).decode()


IMAGE = {"type": "image_url", "image_url": {"url": _data_url("a.png", "image/png")}}
AUDIO = {"type": "input_audio", "input_audio": {"data": base64.b64encode((FIXTURES / "tone.wav").read_bytes()).decode(), "format": "wav"}}


def _mp4(frames: int, audio_seconds: float | None, size: int = 32, fps: int = 2, rate: int = 16000) -> bytes:
    """A tiny mp4 written with PyAV: noise frames, and a tone on an AAC track when asked."""
    import av
    import numpy as np

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width = video.height = size
        video.pix_fmt, video.time_base = "yuv420p", Fraction(1, fps)
        audio = out.add_stream("aac", rate=rate, layout="mono") if audio_seconds else None
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8), format="rgb24")
            frame.pts = i
            out.mux(video.encode(frame))
        out.mux(video.encode())
        if audio is not None:
            wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(audio_seconds * rate)) / rate)).astype(np.float32)
            for start in range(0, wave.size, 1024):
                frame = av.AudioFrame.from_ndarray(wave[None, start : start + 1024], format="flt", layout="mono")
                frame.sample_rate, frame.pts = rate, start
                out.mux(audio.encode(frame))
            out.mux(audio.encode())
    return buf.getvalue()


def _video(audio_seconds: float | None) -> dict:
    # Two frames: transformers' processor scales each frame up to >= 128*32*32 pixels, so one
    # temporal patch is ~2,000 tokens, which is what the tiny checkpoint's context holds.
    data = base64.b64encode(_mp4(2, audio_seconds)).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}


def _user(*parts: dict) -> list[dict]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": list(parts)}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar.testing.release_layouts import variant_copy
    from mstar_qwen3omni.tiny_checkpoint import write_checkpoint
    from thinker_reference import RELEASE

    written = write_checkpoint(tmp_path_factory.mktemp("qwen3omni-written"))
    return variant_copy(written, tmp_path_factory.mktemp("qwen3omni-release"), *RELEASE)


@pytest.fixture(scope="module")
def server(ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("qwen3omni-server") / "server.log"
    with omni_server(["--preprocess-workers", "1"], log, weights=ckpt) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="qwen3omni", messages=messages, max_tokens=8, temperature=0, **kw)


@pytest.mark.parametrize("parts", [(IMAGE, {"type": "text", "text": "What is in the picture?"}),
                                   (AUDIO, {"type": "text", "text": "Describe the sound."})], ids=["image", "audio"])
def test_media_chat_whole_and_streamed_agree(client, parts):
    whole = _chat(client, _user(*parts))
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
    assert whole.usage.prompt_tokens > 20  # the media placeholders were expanded
    stream = _chat(client, _user(*parts), stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content


def test_video_chat_with_and_without_its_audio(client):
    ask = {"type": "text", "text": "What happens?"}
    silent = _chat(client, _user(_video(None), ask))
    assert silent.choices[0].finish_reason == "length" and silent.usage.prompt_tokens > 2000
    messages = _user(_video(1.0), ask)
    with_audio = _chat(client, messages, extra_body={"use_audio_in_video": True})
    # the audio track's placeholders are interleaved with the video's
    assert with_audio.usage.prompt_tokens > silent.usage.prompt_tokens
    stream = _chat(client, messages, stream=True, extra_body={"use_audio_in_video": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == with_audio.choices[0].message.content


def test_text_chat_equals_transformers_greedy(client, ckpt):
    from thinker_reference import reference_prompt
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    messages = [{"role": "user", "content": "Hello!"}]
    out = _chat(client, messages)
    ids = torch.tensor([reference_prompt(ckpt, messages)])
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), return_audio=False,
                              thinker_max_new_tokens=8, thinker_do_sample=False)[0, ids.shape[1]:]
    assert out.usage.prompt_tokens == ids.shape[1] and out.usage.completion_tokens == len(want) == 8
    assert out.choices[0].message.content == AutoTokenizer.from_pretrained(str(ckpt)).decode(want, skip_special_tokens=True)
    assert out.choices[0].finish_reason == "length"


def test_seeded_multimodal_request_is_the_same_alone_and_in_a_mixed_batch(client):
    seeded = {"temperature": 1.0, "seed": 7}
    probe = _user(IMAGE, AUDIO, {"type": "text", "text": "Both?"})
    alone = client.chat.completions.create(model="qwen3omni", messages=probe, max_tokens=8, **seeded).choices[0].message.content
    others = [_user(IMAGE, {"type": "text", "text": f"picture {i}"}) if i % 3 == 0 else
              _user(AUDIO, {"type": "text", "text": f"sound {i}"}) if i % 3 == 1 else
              [{"role": "user", "content": f"text only {i}"}] for i in range(7)]

    def send(messages):
        return client.chat.completions.create(model="qwen3omni", messages=messages, max_tokens=8, temperature=1.0).choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, m) for m in others[:4]]
        probe_future = pool.submit(lambda: client.chat.completions.create(model="qwen3omni", messages=probe, max_tokens=8,
                                                                        **seeded).choices[0].message.content)
        futures += [pool.submit(send, m) for m in others[4:]]
        assert all(f.result() is not None for f in futures)
        assert probe_future.result() == alone


@pytest.mark.parametrize(
    ("part", "needle"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"not a png").decode()}},
         "messages[1].content[0] (image_url)"),
        ({"type": "input_audio", "input_audio": {"data": AUDIO["input_audio"]["data"], "format": "mp3"}},
         "messages[1].content[0] (input_audio)"),
        ({"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}, "messages[1].content[0] (image_url)"),
    ],
    ids=["corrupt-image", "wrong-audio-format", "disallowed-remote-url"],
)
def test_bad_media_part_is_a_400_naming_it_and_the_server_keeps_serving(client, part, needle):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, _user(part, {"type": "text", "text": "?"}))
    assert needle in str(err.value)
    assert _chat(client, _user(IMAGE)).choices[0].finish_reason == "length"


def test_native_generate_with_processor_tensors_equals_the_chat(server, client, ckpt):
    """``/v1/generate`` with the prompt ids and processor tensors of an image chat (made by
    the plugin's preprocessor on the served checkpoint) and kwarg ``media``: the same tokens
    as the chat completion."""
    from mstar.api.tensors import tensor_from_json, tensor_to_json
    from mstar.text import load_tokenizer
    from mstar_qwen3omni.processing import Preprocessor

    messages = _user(IMAGE, {"type": "text", "text": "Describe it."})
    processed = Preprocessor.from_checkpoint(ckpt)(messages)
    inputs = {"prompt_ids": torch.tensor(processed.input_ids), **processed.tensors}
    body = {"model": "qwen3omni", "inputs": {k: tensor_to_json(v) for k, v in inputs.items()},
            "sampling": {"thinker": {"temperature": 0, "max_tokens": 8}}, "kwargs": {"media": ["image"]}}
    reply = httpx.post(f"{server}/v1/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    out = reply.json()["outputs"]["tokens"]
    tokens = tensor_from_json(out, "tokens").reshape(-1).tolist()
    chat = _chat(client, messages).choices[0].message.content
    assert len(tokens) == 8 and load_tokenizer(ckpt).decode(tokens, skip_special_tokens=True) == chat
