"""The playground's spoken chat on Qwen3-Omni (``mstar serve --model qwen3omni
--random-weights``, the tiny checkpoint with Talker and Code2Wav) in headless chromium:
the model's card offers spoken replies, the voice picker lists the checkpoint's speakers,
and a seeded spoken reply streams into the page: the pcm16 it received and decoded equals
the same request's audio over HTTP, and its transcript renders. A screenshot is saved
beside the server log (the path is printed)."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import soundfile as sf
from conftest import ServerProcess
from test_playground import browser, option_values, page_clip  # noqa: F401  (browser: the fixture)

pytestmark = pytest.mark.e2e

# The Thinker writes 8 tokens; the Talker speaks 24 frames (past its codec EOS).
SAMPLING = {"nodes": {"talker": {"max_tokens": 24, "ignore_eos": True}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("playground-omni") / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    srv = ServerProcess(["--model", "qwen3omni", "--random-weights", "--preprocess-workers", "0"], log, env=env)
    try:
        srv.start(timeout=480)  # a loaded 2-core machine: the random checkpoint and warm-up take minutes
        yield srv
    finally:
        try:
            srv.stop()
        finally:
            srv.kill_all()


def test_qwen3omni_chat_speaks_in_the_page(server: ServerProcess, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 240)
    browser.get(f"{server.url}/")
    by_id = lambda name: browser.find_element(By.ID, name)  # noqa: E731
    wait.until(lambda _: by_id("model").get_attribute("data-shown") == "qwen3omni")
    assert by_id("chat-panel").is_displayed() and by_id("chat-audio-controls").is_displayed()
    voices = httpx.get(f"{server.url}/v1/audio/voices", params={"model": "qwen3omni"}, timeout=10).json()["data"]
    assert option_values(by_id("chat-voice")) == [v["name"] for v in voices] and len(voices) > 1

    msg = by_id("chat-text")
    msg.clear()
    msg.send_keys("Tell me about the sea.")
    tokens = by_id("chat-max-tokens")
    tokens.clear()
    tokens.send_keys("8")
    by_id("chat-seed").send_keys("11")
    by_id("chat-sampling").send_keys(json.dumps(SAMPLING))
    voice = voices[1]["name"]  # not the default (whose audio differs): the picker's choice goes out
    Select(by_id("chat-voice")).select_by_value(voice)
    by_id("chat-speak").click()
    by_id("send").click()
    reply, status = by_id("chat-reply"), by_id("chat-status")
    wait.until(lambda _: reply.get_attribute("data-state") in ("done", "error"))
    assert reply.get_attribute("data-state") == "done", by_id("error").text

    body = {"model": "qwen3omni", "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 8,
            "seed": 11, "sampling": SAMPLING, "modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"}}
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=240)
    assert whole.status_code == 200, whole.text
    audio = whole.json()["choices"][0]["message"]["audio"]
    pcm = base64.b64decode(audio["data"])
    assert len(pcm) > 0 and audio["transcript"]
    assert reply.get_attribute("textContent") == audio["transcript"]
    assert int(status.get_attribute("data-audio-bytes")) == len(pcm)
    clip, clip_rate = sf.read(io.BytesIO(page_clip(browser, "chat-audio")), dtype="int16")
    assert clip.tobytes() == pcm  # the very samples of the picked voice
    rate, decoded_rate = int(status.get_attribute("data-sample-rate")), int(status.get_attribute("data-decoded-rate"))
    assert rate == clip_rate == int(whole.headers["x-sample-rate"]) == 24000
    assert abs(int(status.get_attribute("data-decoded-samples")) - len(pcm) // 2 * decoded_rate / rate) <= 1
    # The audio came in pieces, each played as scheduled.
    pieces = int(status.get_attribute("data-audio-pieces"))
    assert pieces >= 2
    wait.until(lambda _: int(status.get_attribute("data-played-chunks")) == pieces)
    shot = Path(server.log_path).parent / "playground-qwen3omni.png"
    browser.save_screenshot(str(shot))
    print(f"playground screenshot (qwen3omni spoken chat): {shot}")
    assert shot.stat().st_size > 0
