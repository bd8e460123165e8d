"""``POST /v1/audio/transcriptions`` and ``/translations`` through the official ``openai``
client against a real ``mstar serve`` (the ``asrtoy`` fixture plugin beside the toy, with an
API key), every ``response_format``, whole and streamed; bad files as 400s naming ``file``; a
model without the endpoint answers the not-served 404. The same server checks the plugin's
own route (auth, error shape, metrics, admission), its upload part name, its warm-up by
transcription and its optional prompt input (tests/fixtures/plugins/asr_toy)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import API_KEY, ServerProcess, with_site

pytestmark = pytest.mark.e2e
PLUGIN = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "asr_toy"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
MAX_TOKENS = 12


def _wav(seconds: float, rate: int = 16000, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def _pip(*args: str | Path) -> None:
    proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def asr_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture plugin installed (real dist-info and entry points) into a folder of its own."""
    root = tmp_path_factory.mktemp("asr-plugin")
    src = root / "src"  # a copy: setuptools' build/ and egg-info never litter the repo
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheels", src)
    _pip("install", "--no-deps", "--no-index", "--target", root / "site", *(root / "wheels").glob("*.whl"))
    return root / "site"


@pytest.fixture(scope="module")
def server(asr_site: Path, toy_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("asr-server") / "server.log"
    args = ["--model", f"toy:{toy_checkpoint}", "--model", f"asrtoy:{toy_checkpoint}", "--max-concurrency", "1", "--max-queue", "1"]
    proc = ServerProcess(args, log, API_KEY, with_site(asr_site, OMP_NUM_THREADS="1"))
    proc.start(timeout=300)
    yield proc
    try:
        proc.stop()
    finally:
        proc.kill_all()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _transcribe(client: openai.OpenAI, **kw):
    kw.setdefault("file", ("tone.wav", _wav(1.0), "audio/wav"))
    return client.audio.transcriptions.create(model="asrtoy", temperature=0, extra_body={"max_tokens": MAX_TOKENS}, **kw)


def test_warm_up_is_a_transcription(server: ServerProcess) -> None:
    assert "warming up with a transcription request" in server.log_path.read_text()


def test_every_response_format_carries_the_same_text(client: openai.OpenAI) -> None:
    whole = _transcribe(client)
    text = whole.text
    assert text and whole.usage.type == "tokens" and whole.usage.output_tokens == MAX_TOKENS
    assert _transcribe(client, response_format="text") == text
    verbose = _transcribe(client, response_format="verbose_json")
    assert verbose.text == text and verbose.duration == pytest.approx(1.0) and verbose.segments[0].end == pytest.approx(1.0)
    srt = _transcribe(client, response_format="srt")
    assert srt == f"1\n00:00:00,000 --> 00:00:01,000\n{text.strip()}\n\n"
    vtt = _transcribe(client, response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n{text.strip()}\n\n"
    # the adapter's prompt holds the request's ``prompt`` after a description of the audio
    assert _transcribe(client, prompt="words").usage.input_tokens == whole.usage.input_tokens + 5


def test_streamed_deltas_join_to_the_whole_text(client: openai.OpenAI) -> None:
    whole = _transcribe(client, language="en").text
    events = list(_transcribe(client, language="en", stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 1 and events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text == whole
    assert events[-1].usage.output_tokens == MAX_TOKENS
    assert "".join(e.delta for e in _transcribe(client, language="en", stream=True, response_format="text")
                   if e.type == "transcript.text.delta") == whole


def test_translation_is_its_own_task(client: openai.OpenAI) -> None:
    out = client.audio.translations.create(model="asrtoy", file=("t.wav", _wav(1.0), "audio/wav"), temperature=0,
                                           extra_body={"max_tokens": MAX_TOKENS})
    # the adapter's prompt starts with the task: "translate", one letter shorter than "transcribe"
    assert out.text and out.model_extra["usage"]["input_tokens"] == _transcribe(client).usage.input_tokens - 1


@pytest.mark.parametrize(("file", "needle"), [
    (("a.wav", b"RIFF-not-really-audio", "audio/wav"), "not readable audio"),
    (("a.wav", b"", "audio/wav"), "empty"),
    (("a.wav", _wav(6.0), "audio/wav"), "at most 5 s"),
], ids=["not-audio", "empty", "too-long"])
def test_bad_file_is_a_400_naming_file(client: openai.OpenAI, file, needle) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _transcribe(client, file=file)
    assert err.value.body["param"] == "file" and needle in err.value.body["message"]
    assert _transcribe(client).text  # still serving


def test_missing_file_and_bad_fields_name_the_field(server: ServerProcess) -> None:
    url = f"{server.url}/v1/audio/transcriptions"
    r = httpx.post(url, data={"model": "asrtoy"}, files={"x": ("a.txt", b"")}, headers=server.headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x"
    r = httpx.post(url, data={"model": "asrtoy", "prompt": "hi"}, headers={**server.headers, "content-type": "multipart/form-data; boundary=b"},
                   content=b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nasrtoy\r\n--b--\r\n')
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text
    wav = {"file": ("a.wav", _wav(0.5), "audio/wav")}
    r = httpx.post(url, data={"model": "asrtoy", "response_format": "mp3"}, files=wav, headers=server.headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = httpx.post(url, data={"model": "asrtoy", "response_format": "srt", "stream": "true"}, files=wav, headers=server.headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    assert httpx.post(url, data={"model": "asrtoy"}, files=wav).status_code == 401  # core's API key applies


def test_a_model_without_the_endpoint_answers_not_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.audio.transcriptions.create(model="toy", file=("a.wav", _wav(0.5), "audio/wav"))
    assert err.value.body["code"] == "endpoint_not_served"
    assert [m.id for m in client.models.list() if "transcription" in m.model_extra["endpoints"]] == ["asrtoy"]


def test_upload_part_named_by_the_adapter(server: ServerProcess, client: openai.OpenAI) -> None:
    """A part named ``audio`` (not a graph input) reaches the adapter, which decodes it: the
    same prompt, so the same tokens, as the transcription of the file."""
    import json

    from mstar.api.tensors import tensor_from_json

    wav = _wav(1.0)
    request = {"model": "asrtoy", "sampling": {"lm": {"temperature": 0, "max_tokens": MAX_TOKENS}}, "signals": ["token"]}
    r = httpx.post(f"{server.url}/v1/generate/upload", data={"request": json.dumps(request)}, files={"audio": ("a.wav", wav)},
                   headers=server.headers, timeout=60)
    assert r.status_code == 200, r.text
    tokens = tensor_from_json(r.json()["outputs"]["token"], "token").reshape(-1).tolist()
    text = bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
    assert text == _transcribe(client, file=("a.wav", wav, "audio/wav")).text


def test_plugin_route_gets_auth_errors_metrics_and_admission(server: ServerProcess) -> None:
    url = f"{server.url}/v1/asrtoy/loudness"
    assert httpx.post(url, json={"text": "hi"}).status_code == 401
    before = server.metric("mstar_requests_total", model="asrtoy", endpoint="/v1/asrtoy/loudness", status="200") if _has(
        server, "/v1/asrtoy/loudness") else 0.0
    r = httpx.post(url, json={"text": "hi", "max_tokens": 5}, headers=server.headers, timeout=60)
    assert r.status_code == 200 and len(r.json()["tokens"]) == 5 and r.json()["finish_reason"] == "length"
    assert r.json()["model"] == "asrtoy"
    bad = httpx.post(url, json={"fail": True}, headers=server.headers)
    assert bad.status_code == 400 and bad.json() == {"error": {"message": "fail: asked to fail", "type": "invalid_request_error",
                                                               "param": "fail", "code": None}}
    assert server.metric("mstar_requests_total", model="asrtoy", endpoint="/v1/asrtoy/loudness", status="200") == before + 1
    assert server.metric("mstar_requests_total", model="asrtoy", endpoint="/v1/asrtoy/loudness", status="400") >= 1

    def long(_: int) -> httpx.Response:  # one runs, one waits, the rest are refused (--max-concurrency 1 --max-queue 1)
        return httpx.post(url, json={"text": "x", "max_tokens": 400}, headers=server.headers, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        statuses = sorted(r.status_code for r in pool.map(long, range(6)))
    assert statuses.count(200) >= 2 and 429 in statuses, statuses


def _has(server: ServerProcess, endpoint: str) -> bool:
    try:
        server.metric("mstar_requests_total", endpoint=endpoint, status="200")
        return True
    except KeyError:
        return False


def test_mstar_client_transcribes(server: ServerProcess, client: openai.OpenAI) -> None:
    from mstar.client import Client

    wav = _wav(1.0)
    want = _transcribe(client, file=("a.wav", wav, "audio/wav")).text
    with Client(server.url, api_key=API_KEY) as c:
        assert c.transcribe(wav, "asrtoy", temperature=0, max_tokens=MAX_TOKENS)["text"] == want
        assert c.transcribe(wav, "asrtoy", response_format="text", temperature=0, max_tokens=MAX_TOKENS) == want
        assert "".join(c.transcribe_stream(wav, "asrtoy", temperature=0, max_tokens=MAX_TOKENS)) == want
