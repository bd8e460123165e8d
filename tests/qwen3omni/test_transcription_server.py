"""``POST /v1/audio/transcriptions`` and ``/translations`` on ``mstar serve --model qwen3omni``
(the plugin's tiny checkpoint) through the official openai client: the text equals
transformers' greedy ``generate`` on the same checkpoint for the same chat (the audio and the
instruction in one user message, templated and featurised by transformers' processor), in
every response_format and streamed; a file that is no audio is a 400 naming ``file``."""

from __future__ import annotations

import functools
from pathlib import Path

import openai
import pytest
import soundfile as sf
import torch
from omni_server import omni_server

pytestmark = pytest.mark.e2e
TONE = Path(__file__).parent / "fixtures" / "processor" / "tone.wav"  # 1.3 s at 16 kHz, the processor's rate
STEPS = 8


def _chat(instruction: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": instruction}]}]


@functools.cache
def _reference(ckpt: str, instruction: str) -> str:
    """transformers: its Qwen3-Omni processor and model, greedy, text out."""
    from mstar_qwen3omni.processing import build_hf_processor
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    processor = build_hf_processor(ckpt)  # transformers' Qwen3OmniMoeProcessor on the checkpoint's files
    text = processor.apply_chat_template(_chat(instruction), tokenize=False, add_generation_prompt=True)
    wave, rate = sf.read(TONE, dtype="float32")
    assert rate == processor.feature_extractor.sampling_rate
    inputs = processor(text=[text], audio=[wave], return_tensors="pt")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(**inputs, return_audio=False, thinker_max_new_tokens=STEPS, thinker_do_sample=False)
    return AutoTokenizer.from_pretrained(ckpt).decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def client(omni_ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("omni-transcriptions") / "server.log"
    with omni_server(["--preprocess-workers", "1"], log, weights=omni_ckpt) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def _transcribe(client: openai.OpenAI, **kw):
    kw.setdefault("file", ("tone.wav", TONE.read_bytes(), "audio/wav"))
    return client.audio.transcriptions.create(model="qwen3omni", temperature=0, extra_body={"max_tokens": STEPS}, **kw)


@pytest.mark.parametrize(("language", "instruction"), [(None, "Transcribe the audio."), ("en", "Transcribe the audio in English.")])
def test_transcription_equals_transformers_greedy(client, omni_ckpt, language, instruction):
    out = _transcribe(client, **({"language": language} if language else {}))
    assert out.text == _reference(str(omni_ckpt), instruction)
    assert out.usage.output_tokens <= STEPS and out.usage.input_tokens > 20  # the audio placeholders were expanded


def test_translation_equals_transformers_greedy(client, omni_ckpt):
    with pytest.warns(DeprecationWarning):  # the client marks translations.create deprecated
        out = client.audio.translations.create(model="qwen3omni", file=("tone.wav", TONE.read_bytes(), "audio/wav"),
                                               temperature=0, extra_body={"max_tokens": STEPS})
    assert out.text == _reference(str(omni_ckpt), "Translate the audio into English.")


def test_every_format_and_the_stream_carry_the_same_text(client):
    text = _transcribe(client).text
    assert _transcribe(client, response_format="text") == text
    verbose = _transcribe(client, response_format="verbose_json")
    assert verbose.text == text and verbose.duration == pytest.approx(1.3)
    assert _transcribe(client, response_format="srt") == f"1\n00:00:00,000 --> 00:00:01,300\n{text.strip()}\n\n"
    assert _transcribe(client, response_format="vtt") == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.300\n{text.strip()}\n\n"
    events = list(_transcribe(client, stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text == text
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == text


def test_a_file_that_is_no_audio_is_a_400_naming_file(client):
    with pytest.raises(openai.BadRequestError) as err:
        _transcribe(client, file=("a.wav", b"not audio at all", "audio/wav"))
    assert err.value.body["param"] == "file"
    assert _transcribe(client).text is not None  # still serving
