"""The fixture Whisper plugin behind a real ``mstar serve``: ``/v1/audio/transcriptions`` and
``/translations`` through the official ``openai`` client, whole and streamed, equal to
transformers (the same feature extractor, ``generate`` on the same prompt, the tokenizer's
decode); its ready line and metrics name the cross-attention caches."""

from __future__ import annotations

import importlib.util
import io
import re
import time
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
import torch

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")
MAX_TOKENS = 20

_spec = importlib.util.spec_from_file_location("whisper_e2e_helpers", Path(__file__).parents[1] / "e2e" / "conftest.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)  # type: ignore[union-attr]


def wav(seconds: float, rate: int, freq: float) -> tuple[bytes, np.ndarray]:
    t = np.arange(int(seconds * rate)) / rate
    audio = (0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * np.sin(2 * np.pi * 3.1 * freq * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue(), audio


@pytest.fixture(scope="module")
def server(whisper_site: Path, whisper_ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("whisper-server") / "server.log"
    proc = e2e.ServerProcess(["--model", "tinywhisper", "--weights", str(whisper_ckpt)], log, None, e2e.with_site(whisper_site, OMP_NUM_THREADS="1"))
    proc.start(timeout=300)
    yield proc
    try:
        proc.stop()
    finally:
        proc.kill_all()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def expected(ckpt: Path, hf, audio: np.ndarray, prompt: list[str]) -> str:
    fe = transformers.WhisperFeatureExtractor.from_pretrained(ckpt)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    features = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
    ids = tok.convert_tokens_to_ids(prompt)
    with torch.no_grad():
        out = hf.generate(input_features=features, decoder_input_ids=torch.tensor([ids]), max_new_tokens=MAX_TOKENS,
                          do_sample=False, suppress_tokens=None, begin_suppress_tokens=None)
    new = out[0].tolist()
    new = new[len(ids):] if new[: len(ids)] == ids else new
    return tok.decode(new, skip_special_tokens=True)


@pytest.mark.parametrize("freq", [220.0, 523.0])
def test_transcription_whole_and_streamed_equal_transformers(client, whisper_ckpt, whisper_hf, freq) -> None:
    data, audio = wav(0.8, 16000, freq)
    want = expected(whisper_ckpt, whisper_hf, audio, ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    assert want
    kw = {"model": "tinywhisper", "file": ("a.wav", data, "audio/wav"), "language": "en", "temperature": 0,
          "extra_body": {"max_tokens": MAX_TOKENS}}
    assert client.audio.transcriptions.create(**kw).text == want
    stream = client.audio.transcriptions.create(**kw, stream=True)
    events = list(stream)
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == want
    assert events[-1].type == "transcript.text.done" and events[-1].text == want


def test_translation_uses_the_translate_task(client, whisper_ckpt, whisper_hf) -> None:
    data, audio = wav(0.5, 16000, 300.0)
    want = expected(whisper_ckpt, whisper_hf, audio, ["<|startoftranscript|>", "<|translate|>", "<|notimestamps|>"])
    got = client.audio.translations.create(model="tinywhisper", file=("a.wav", data, "audio/wav"), temperature=0,
                                           extra_body={"max_tokens": MAX_TOKENS})
    assert got.text == want
    other = expected(whisper_ckpt, whisper_hf, audio, ["<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>"])
    assert other != want, "translate and transcribe prompts gave one text: the test could not tell them apart"


def test_other_sample_rates_are_resampled(client, whisper_ckpt, whisper_hf) -> None:
    import soxr

    data, audio = wav(0.8, 24000, 440.0)
    want = expected(whisper_ckpt, whisper_hf, soxr.resample(audio, 24000, 16000),
                    ["<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>"])
    got = client.audio.transcriptions.create(model="tinywhisper", file=("a.wav", data, "audio/wav"), temperature=0,
                                             extra_body={"max_tokens": MAX_TOKENS})
    assert got.text == want


def test_bad_input_is_a_400_naming_the_field(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(model="tinywhisper", file=("a.wav", b"not audio at all", "audio/wav"))
    assert err.value.body["param"] == "file"
    data, _ = wav(0.5, 16000, 300.0)
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(model="tinywhisper", file=("a.wav", data, "audio/wav"), language="xx")
    assert err.value.body["param"] == "language"
    data, _ = wav(1.5, 16000, 300.0)  # the model takes 1 s
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(model="tinywhisper", file=("a.wav", data, "audio/wav"))
    assert err.value.body["param"] == "file"


def test_ready_line_and_metrics_name_the_cross_attention_caches(server) -> None:
    line = next(ln for ln in server.log_path.read_text().splitlines() if "mstar serve ready" in ln)
    # 2 layers x K,V x 4 kv heads x 8 dims x 4 bytes (float32) = 512 bytes a position, self or cross.
    assert re.search(r"KV capacity decoder [\d,]+ tokens \(self- and cross-attention, 512 bytes a token\)", line), line
    # Nothing held between requests. Stats arrive every 0.1 s, so the last test's request
    # may still be counted for a moment.
    deadline = time.monotonic() + 10
    while (held := server.metric("mstar_kv_cross_attention_bytes", node="decoder")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held == 0.0
