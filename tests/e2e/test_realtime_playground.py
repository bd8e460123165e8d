"""The playground's Talk panel on Qwen3-Omni (``mstar serve --model qwen3omni
--random-weights``) in headless chromium with a fake microphone (a WAV this test writes:
silence, a voiced sound, silence): the page streams the microphone over ``WS /v1/realtime``
through its AudioWorklet, the server's VAD ends the turn, and the answer plays. The
transcript the page rendered and the PCM it played equal the answer the same audio chunks
get over ``/v1/realtime`` from a plain client; the panel shows time to first audio / token
and the real-time factor."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from conftest import ServerProcess
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SAMPLING = {"nodes": {"talker": {"max_tokens": 24, "ignore_eos": True}}}  # 24 frames, past its codec EOS


def vowel(seconds: float, rate: int, f0: float = 120.0) -> np.ndarray:
    """A voiced, speech-like sound (as in tests/qwen3omni/test_realtime.py): a jittered pulse
    train through three formant resonators, in 4 Hz syllables."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    y = np.diff(np.floor(np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / rate), prepend=0.0)
    for freq, bw in ((700, 80), (1220, 90), (2600, 120)):
        r, th = np.exp(-np.pi * bw / rate), 2 * np.pi * freq / rate
        out, y1, y2 = np.zeros(n), 0.0, 0.0
        for i in range(n):
            y1, y2 = (1 - r) * y[i] + 2 * r * np.cos(th) * y1 - r * r * y2, y1
            out[i] = y1
        y = out
    y *= 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    return (0.5 * y / np.abs(y).max()).astype(np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("realtime-playground") / "server.log"
    srv = ServerProcess(["--model", "qwen3omni", "--random-weights", "--preprocess-workers", "0"], log,
                        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        srv.start(timeout=480)
        yield srv
    finally:
        try:
            srv.stop()
        finally:
            srv.kill_all()


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the fake microphone says once (no loop): 1 s silence, 1.5 s of voice, 4 s silence."""
    rate = 48000  # as a sound card gives
    wave = np.concatenate([np.zeros(rate), vowel(1.5, rate), np.zeros(4 * rate)]).astype(np.float32)
    path = tmp_path_factory.mktemp("mic") / "turn.wav"
    sf.write(path, wave, rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(microphone: Path) -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium and chromium-driver; see .ci/run)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMEDRIVER is not None, "chromium is installed but chromedriver is not (apt-get install chromium-driver)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1200",
                "--autoplay-policy=no-user-gesture-required", "--mute-audio",
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone}%noloop"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def replay(server: ServerProcess, session_update: dict[str, Any], chunks: list[str]) -> dict[str, Any]:
    """The same settings and audio chunks from a plain client: the first answer."""
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=qwen3omni"
    with connect(url, proxy=None, open_timeout=30, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=60))["type"] == "session.created"
        ws.send(json.dumps(session_update))
        for chunk in chunks:
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        transcript, pcm = "", b""
        while True:
            event = json.loads(ws.recv(timeout=240))
            if event["type"] == "response.output_audio_transcript.delta":
                transcript += event["delta"]
            elif event["type"] == "response.output_audio.delta":
                pcm += base64.b64decode(event["delta"])
            elif event["type"] == "response.done":
                return {"transcript": transcript, "pcm": pcm, "status": event["response"]["status"]}


def test_talk_panel_hears_the_microphone_and_plays_the_answer(server: ServerProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 240)
    browser.get(f"{server.url}/")
    by_id = lambda name: browser.find_element(By.ID, name)  # noqa: E731
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "qwen3omni")
    assert by_id("talk-panel").is_displayed()
    by_id("talk-seed").send_keys("5")
    tokens = by_id("talk-max-tokens")
    tokens.clear()
    tokens.send_keys("6")
    by_id("talk-sampling").send_keys(json.dumps(SAMPLING))
    by_id("talk-start").click()
    status = by_id("talk-status")
    wait.until(lambda _: status.get_attribute("data-answers") == "1" or by_id("error").text)
    assert not by_id("error").text, by_id("error").text
    talk = browser.execute_script("return mstarTalk;")
    answer = talk["answers"][0]
    rendered = browser.find_elements(By.CSS_SELECTOR, "#talk-reply .answer")[0].get_attribute("textContent")
    played = b"".join(base64.b64decode(p) for p in answer["audio"].split("|"))
    assert answer["transcript"] and rendered == answer["transcript"] and len(played) > 0
    assert talk["session"]["session"]["seed"] == 5 and talk["session"]["session"]["max_output_tokens"] == 6
    # The worklet's 24 kHz: the VAD hears the 1.5 s sound (its syllables' soft ends aside) as
    # about a second of speech, not twice that (no resampling) or half.
    turn = talk["turns"][0]
    assert 700 <= turn["end_ms"] - turn["start_ms"] <= 1500, turn
    same = replay(server, talk["session"], talk["sent"])
    assert same["transcript"] == rendered and same["pcm"] == played and same["status"] == answer["status"]
    for key in ("data-ttfa-ms", "data-ttft-ms", "data-rtf"):
        assert float(status.get_attribute(key)) > 0, key
    print("talk panel:", status.text, f"({len(played)} PCM bytes played; turn heard {turn})")
    by_id("talk-start").click()
    wait.until(lambda _: status.get_attribute("data-state") == "closed")
