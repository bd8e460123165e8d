"""The playground page at ``/`` in a real headless browser (Debian's chromium, driven by
Selenium through Debian's chromedriver): against ``mstar serve --model toy --model
orpheus --model vjepa2 --random-weights`` with an API key, it speaks text (streamed PCM arrives, and the
clip decodes to a non-empty AudioBuffer), speaks typed text live over the WebSocket route,
and renders a streamed chat reply; an attached file goes out as a content part; picking
Orpheus (speech only) leaves only the speech panel, with Orpheus's voices, and closes a
live session; V-JEPA 2 (neither) shows no panel but a pointer to the native API; the toy's chat
speaks its answer (the pcm16 the page received and decoded equals the same request's
audio over HTTP, the transcript renders). Screenshots are saved beside the server log
(the paths are printed)."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground") / "server.log"
    args = ["--model", "toy", "--model", "orpheus", "--model", "vjepa2", "--random-weights", "--preprocess-workers", "0"]
    srv = ServerProcess(args, log, api_key=API_KEY)
    try:
        srv.start(timeout=300)
        yield srv
    finally:
        try:
            srv.stop()
        finally:
            srv.kill_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium and chromium-driver; see .ci/run)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMEDRIVER is not None, "chromium is installed but chromedriver is not (apt-get install chromium-driver)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1000",
                "--autoplay-policy=no-user-gesture-required", "--mute-audio"):
        opts.add_argument(arg)
    # An explicit driver path: Selenium Manager never tries to download one.
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_page_is_served_without_the_key(server: ServerProcess) -> None:
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200 and "M* playground" in page.text
    assert httpx.get(f"{server.url}/static/playground.js", timeout=10).status_code == 200
    # The API itself still needs it.
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401


def test_playground_speaks_and_chats_in_a_browser(server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(f"{server.url}/")
    by_id = lambda name: browser.find_element(By.ID, name)  # noqa: E731
    key = by_id("api-key")
    key.send_keys(API_KEY)
    browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", key)
    wait.until(lambda _: by_id("voice").find_elements(By.TAG_NAME, "option"))
    assert by_id("model").get_attribute("value") == "toy"
    assert by_id("voice").get_attribute("value") == "alloy"
    assert by_id("chat-panel").is_displayed() and by_id("speech-panel").is_displayed()

    text = by_id("speech-text")
    text.clear()
    text.send_keys("Hello from a headless browser.")
    by_id("speech-seed").send_keys("5")
    by_id("speak").click()
    status = by_id("speech-status")
    wait.until(lambda _: status.get_attribute("data-state") in ("done", "error"))
    assert status.get_attribute("data-state") == "done", by_id("error").text
    streamed = int(status.get_attribute("data-bytes"))
    decoded, decoded_rate = int(status.get_attribute("data-decoded-samples")), int(status.get_attribute("data-decoded-rate"))
    # The page's bytes are the server's: the same request over HTTP gives as many samples.
    body = {"model": "toy", "input": "Hello from a headless browser.", "response_format": "pcm", "seed": 5, "voice": "alloy"}
    ref = httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=server.headers, timeout=60).content
    assert streamed == len(ref) > 0
    # The browser decoded the whole clip (resampled to its audio context's rate).
    assert abs(decoded - len(ref) // 2 * decoded_rate / 8000) <= 1
    assert int(status.get_attribute("data-sample-rate")) == 8000
    # The streamed chunks were scheduled on the audio context and played to their end.
    wait.until(lambda _: int(status.get_attribute("data-played-chunks")) >= 1)

    # Live mode: typed text goes over WS /v1/audio/speech/stream (the key as a subprotocol),
    # each finished sentence spoken; its bytes are those of each sentence over HTTP.
    text.clear()
    by_id("live").click()
    live = by_id("live-status")
    wait.until(lambda _: live.get_attribute("data-state") == "open")
    text.send_keys("Live one. Live two. ")
    wait.until(lambda _: int(live.get_attribute("data-segments") or 0) >= 2)
    want = 0
    for sentence in ("Live one.", "Live two."):
        req = {**body, "input": sentence}
        want += len(httpx.post(f"{server.url}/v1/audio/speech", json=req, headers=server.headers, timeout=60).content)
    assert int(live.get_attribute("data-bytes")) == want > 0
    by_id("live").click()  # flush, then the page closes the socket
    wait.until(lambda _: live.get_attribute("data-state") == "closed")
    assert not by_id("error").text

    msg = by_id("chat-text")
    msg.clear()
    msg.send_keys("Hi there")
    by_id("send").click()
    reply = by_id("chat-reply")
    wait.until(lambda _: reply.get_attribute("data-state") in ("done", "error"))
    assert reply.get_attribute("data-state") == "done", by_id("error").text
    assert reply.text.strip(), "the chat reply is empty"
    assert "tokens" in by_id("chat-status").text

    shot = Path(server.log_path).parent / "playground.png"
    browser.save_screenshot(str(shot))
    print(f"playground screenshot: {shot}")
    assert shot.stat().st_size > 0

    # An attached audio file goes out as an input_audio part: the toy (text only) refuses
    # it with its 400, which the page shows.
    clip = tmp_path / "clip.wav"
    sf.write(clip, np.zeros(800, np.float32), 8000)
    by_id("chat-file").send_keys(str(clip))
    by_id("send").click()
    wait.until(lambda _: reply.get_attribute("data-state") in ("done", "error"))
    assert reply.get_attribute("data-state") == "error"
    shown = by_id("error").text
    assert shown.startswith("Chat failed: 400:") and "messages[0]: the toy model reads text parts only" in shown


def open_page(server: ServerProcess, browser: Any) -> tuple[Any, Any]:
    """The page loaded with the key (kept in localStorage) and showing the first model:
    ``(by_id, wait)``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(f"{server.url}/")
    if browser.execute_script("return localStorage.getItem('mstar-api-key')") != API_KEY:  # this test alone
        browser.execute_script("localStorage.setItem('mstar-api-key', arguments[0])", API_KEY)
        browser.get(f"{server.url}/")
    by_id = lambda name: browser.find_element(By.ID, name)  # noqa: E731
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "toy")
    return by_id, wait


def option_values(select: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [o.get_attribute("value") for o in select.find_elements(By.TAG_NAME, "option")]


def page_clip(browser: Any, audio_id: str) -> bytes:
    """The WAV clip the page built for its ``<audio id=audio_id>`` player, read back from
    its blob URL."""
    script = """
        const done = arguments[arguments.length - 1];
        fetch(document.getElementById(arguments[0]).src).then((r) => r.arrayBuffer()).then((buf) => {
          let bin = "";
          for (const b of new Uint8Array(buf)) bin += String.fromCharCode(b);
          done(btoa(bin));
        }).catch((err) => done("error: " + err));
    """
    out = browser.execute_async_script(script, audio_id)
    assert not out.startswith("error"), out
    return base64.b64decode(out)


def test_the_panels_follow_the_model_picked(server: ServerProcess, browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    by_id, wait = open_page(server, browser)
    cards = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models", headers=server.headers, timeout=10).json()["data"]}
    assert cards["toy"]["chat_audio"] is True and cards["orpheus"]["chat_audio"] is False
    assert option_values(by_id("model")) == ["toy", "orpheus", "vjepa2"]
    assert by_id("chat-panel").is_displayed() and by_id("speech-panel").is_displayed()
    assert by_id("chat-audio-controls").is_displayed() and option_values(by_id("chat-voice")) == ["alloy"]
    assert not by_id("no-panel").is_displayed()
    by_id("live").click()  # a live session with the toy ...
    live = by_id("live-status")
    wait.until(lambda _: live.get_attribute("data-state") == "open")

    Select(by_id("model")).select_by_value("orpheus")
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "orpheus")
    assert live.get_attribute("data-state") == "closed" and not by_id("live").is_selected()  # ... ends on a switch
    assert by_id("speech-panel").is_displayed()
    assert not by_id("chat-panel").is_displayed(), "orpheus serves no chat, yet the chat panel shows"
    assert not by_id("no-panel").is_displayed()
    voices = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "orpheus"}, headers=server.headers, timeout=10).json()
    assert option_values(by_id("voice")) == [v["name"] for v in voices["data"]] and "tara" in option_values(by_id("voice"))
    shot = Path(server.log_path).parent / "playground-orpheus.png"
    browser.save_screenshot(str(shot))
    print(f"playground screenshot (orpheus picked): {shot}")

    Select(by_id("model")).select_by_value("vjepa2")  # generate only
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "vjepa2")
    assert not by_id("speech-panel").is_displayed() and not by_id("chat-panel").is_displayed()
    assert by_id("no-panel").is_displayed() and "/v1/generate" in by_id("no-panel").text

    Select(by_id("model")).select_by_value("toy")
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "toy")
    assert by_id("chat-panel").is_displayed() and by_id("chat-audio-controls").is_displayed()
    assert not by_id("no-panel").is_displayed() and option_values(by_id("voice")) == ["alloy"]


def test_chat_speaks_the_answer(server: ServerProcess, browser: Any) -> None:
    by_id, wait = open_page(server, browser)
    msg = by_id("chat-text")
    msg.clear()
    msg.send_keys("Speak to me")
    tokens = by_id("chat-max-tokens")
    tokens.clear()
    tokens.send_keys("24")
    by_id("chat-seed").send_keys("5")
    by_id("chat-speak").click()
    by_id("send").click()
    reply, status = by_id("chat-reply"), by_id("chat-status")
    wait.until(lambda _: reply.get_attribute("data-state") in ("done", "error"))
    assert reply.get_attribute("data-state") == "done", by_id("error").text

    # The same request whole over HTTP: its transcript rendered, its audio is what the page got.
    body = {"model": "toy", "messages": [{"role": "user", "content": "Speak to me"}], "max_tokens": 24, "seed": 5,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=60)
    assert whole.status_code == 200, whole.text
    audio = whole.json()["choices"][0]["message"]["audio"]
    pcm = base64.b64decode(audio["data"])
    assert len(pcm) > 0 and audio["transcript"].strip()
    assert reply.get_attribute("textContent") == audio["transcript"]
    assert int(status.get_attribute("data-audio-bytes")) == len(pcm)
    clip, clip_rate = sf.read(io.BytesIO(page_clip(browser, "chat-audio")), dtype="int16")
    assert clip.tobytes() == pcm  # the very samples the server sent
    rate, decoded_rate = int(status.get_attribute("data-sample-rate")), int(status.get_attribute("data-decoded-rate"))
    assert rate == clip_rate == int(whole.headers["x-sample-rate"])
    # The browser decoded the whole clip (resampled to its audio context's rate), and the
    # pieces scheduled as they arrived played to their end.
    assert abs(int(status.get_attribute("data-decoded-samples")) - len(pcm) // 2 * decoded_rate / rate) <= 1
    pieces = int(status.get_attribute("data-audio-pieces"))
    assert pieces >= 2  # the toy speaks each chunk of codes as it comes
    wait.until(lambda _: int(status.get_attribute("data-played-chunks")) == pieces)
    assert by_id("chat-audio").is_displayed() and not by_id("error").text
    shot = Path(server.log_path).parent / "playground-chat-audio.png"
    browser.save_screenshot(str(shot))
    print(f"playground screenshot (spoken chat): {shot}")
    assert shot.stat().st_size > 0
