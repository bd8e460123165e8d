"""The fixture text LLM plugin (tests/fixtures/plugins/qwen3_text, a Qwen3ForCausalLM on
mstar.text and mstar.layers): check-plugin, greedy ids and per-step logits against
transformers generate, and chat + completions over HTTP with the official openai client.

The tiny checkpoint is written in the real layout (config.json, model.safetensors with HF
keys, a trained byte-level BPE tokenizer and a ChatML chat template)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch

pytestmark = pytest.mark.e2e
transformers = pytest.importorskip("transformers")

MODEL = "tinyqwen3"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "qwen3_text"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello 你好!"}]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture plugin installed as a real distribution into its own folder."""
    root = tmp_path_factory.mktemp("qwen3-site")
    src = root / "src"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    def pip(*args: object) -> None:
        proc = subprocess.run([*PIP, *map(str, args)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr

    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "wheels", src)
    pip("install", "--no-deps", "--no-index", "--target", root / "site", *(root / "wheels").glob("*.whl"))
    return root / "site"


@pytest.fixture(scope="module")
def plugin(site: Path):
    sys.path.insert(0, str(site))
    try:
        from mstar.plugins.loading import load_model

        yield load_model(MODEL)
    finally:
        sys.path.remove(str(site))


@pytest.fixture(scope="module")
def ckpt(plugin, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3")
    plugin.spec.write_tiny_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def hf(ckpt: Path):
    model, info = transformers.Qwen3ForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert not any(info.values()), info  # our keys are exactly HF's
    return model.eval()


@pytest.fixture(scope="module")
def tok(ckpt: Path):
    return transformers.AutoTokenizer.from_pretrained(ckpt)


def hf_greedy(hf, ids: list[int], n: int, eos: bool = True) -> tuple[list[int], torch.Tensor]:
    """transformers generate: (new ids, [steps, vocab] logits); ``eos=False`` never stops early."""
    config = transformers.GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=hf.config.eos_token_id if eos else None,
                                           pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():  # an explicit mask: id 0 is a real token here, not padding
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), generation_config=config)
    return out.sequences[0, len(ids):].tolist(), torch.cat(out.logits)


def test_check_plugin_passes(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "mstar.cli.main", "check-plugin", MODEL], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if line.startswith(("FAIL", "SKIP"))], proc.stdout
    assert re.search(r"all \d+ checks passed", proc.stdout), proc.stdout


def test_plugin_is_about_150_lines() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in (FIXTURE / "fixture_qwen3").glob("*.py"))
    assert lines <= 160, lines


def test_greedy_ids_and_logits_equal_transformers(plugin, ckpt, hf, tok) -> None:
    from mstar import Engine

    prompts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 2, "你好"]
    steps = 10
    # A 16-token budget: the long prompt is prefilled in chunks beside the others' decode.
    with Engine.from_model(MODEL, weights=ckpt, max_num_batched_tokens=16) as engine:
        *outs, plain = engine.run_batch([
            *({"inputs": {"prompt_ids": torch.tensor(tok.encode(p))}, "kwargs": {"return_logits": True},
               "sampling": {"temperature": 0, "max_tokens": steps, "ignore_eos": True}} for p in prompts),
            # In the same batches, without the option.
            {"inputs": {"prompt_ids": torch.tensor(tok.encode(prompts[0]))},
             "sampling": {"temperature": 0, "max_tokens": steps, "ignore_eos": True}},
        ])
    for p, out in zip(prompts, outs, strict=True):
        want_ids, want_logits = hf_greedy(hf, tok.encode(p), steps, eos=False)
        assert out.error is None and out.finish_reason == "length"
        assert out.cat("tokens").tolist() == want_ids
        got_logits = torch.stack(out.signals["logits"])
        assert got_logits.shape == want_logits.shape
        torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=1e-4)
    assert "logits" not in plain.signals  # off unless asked
    assert plain.cat("tokens").tolist() == outs[0].cat("tokens").tolist()


# ---- over HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(site: Path, ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    spec = importlib.util.spec_from_file_location("text_llm_server_process", Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    srv = module.ServerProcess(["--model", MODEL, "--weights", str(ckpt), "--preprocess-workers", "1"],
                               tmp_path_factory.mktemp("log") / "server.log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(site))
        srv.start()
    yield srv
    try:
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill_all()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def expected(hf, tok, ids: list[int], n: int) -> tuple[str, str]:
    """(text, finish_reason) of greedy decoding as transformers does it."""
    new, _ = hf_greedy(hf, ids, n)
    finish = "stop" if new and new[-1] == hf.config.eos_token_id else "length"
    return tok.decode(new, skip_special_tokens=True), finish


def test_chat_whole_and_streamed(client, hf, tok) -> None:
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    text, finish = expected(hf, tok, prompt, 12)
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert resp.choices[0].message.content == text
    assert resp.choices[0].finish_reason == finish
    assert resp.usage.prompt_tokens == len(prompt)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == finish


def test_completions_whole_streamed_and_echo(client, hf, tok) -> None:
    prompt = "The quick brown fox"
    text, finish = expected(hf, tok, tok.encode(prompt), 10)
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == text and resp.choices[0].finish_reason == finish
    assert resp.usage.prompt_tokens == len(tok.encode(prompt))
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + text
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == finish
    by_ids = client.completions.create(model=MODEL, prompt=tok.encode(prompt), max_tokens=10, temperature=0)
    assert by_ids.choices[0].text == text


def test_completion_logprobs_equal_transformers(client, hf, tok) -> None:
    prompt = "Hello world"
    ids, logits = hf_greedy(hf, tok.encode(prompt), 6, eos=False)
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                     extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    want = torch.log_softmax(logits, -1)
    got = torch.tensor(lp.token_logprobs)
    torch.testing.assert_close(got, want[torch.arange(6), torch.tensor(ids)], atol=1e-4, rtol=1e-4)
    assert all(len(top) == 3 for top in lp.top_logprobs)
    assert max(lp.top_logprobs[0].values()) == pytest.approx(want[0].max().item(), abs=1e-4)
    from mstar.text import TokenRenderer

    assert lp.tokens == [TokenRenderer(tok).token_text(i) for i in ids]


def test_stop_string_across_a_token_boundary(client, hf, tok) -> None:
    prompt = "The quick brown fox"
    new, _ = hf_greedy(hf, tok.encode(prompt), 12, eos=False)
    pieces = [tok.decode(new[: i + 1]) for i in range(len(new))]
    full = pieces[-1]
    # A stop string that starts inside one token's text and ends inside a later one.
    cut = next(i for i in range(1, len(new) - 1) if len(pieces[i]) - len(pieces[i - 1]) >= 2 and len(pieces[i + 1]) > len(pieces[i]))
    start = len(pieces[cut]) - 1
    stop = full[start:start + 2]
    want = full[: full.find(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop], stream=True,
                                                    extra_body={"ignore_eos": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
            text, reason = resp.choices[0].text, resp.choices[0].finish_reason
        assert (text, reason) == (want, "stop"), (stop, full)


def test_n_choices_and_prompt_lists_are_seeded(client) -> None:
    kw = dict(model=MODEL, max_tokens=8, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    first = client.completions.create(prompt=["Hello", "你好"], n=2, **kw)
    again = client.completions.create(prompt=["Hello", "你好"], n=2, **kw)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text  # one prompt's choices differ
    assert first.usage.completion_tokens == 4 * 8


def test_chat_logprobs_and_tools_reach_the_template(client, hf, tok) -> None:
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    ids, logits = hf_greedy(hf, prompt, 5, eos=False)
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=2, extra_body={"ignore_eos": True})
    content = resp.choices[0].logprobs.content
    want = torch.log_softmax(logits, -1)[torch.arange(5), torch.tensor(ids)]
    torch.testing.assert_close(torch.tensor([e.logprob for e in content]), want, atol=1e-4, rtol=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in content)
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Now.", "parameters": {"type": "object", "properties": {}}}}]
    with_tools = tok.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True, return_dict=True)["input_ids"]
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0, tools=tools)
    assert resp.usage.prompt_tokens == len(with_tools) > len(prompt)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "Hi", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": "Hi", "suffix": "x"}, "suffix"),
    ({"prompt": "Hi", "n": 2, "best_of": 3}, "best_of"),
    ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [999999]}, "prompt"),
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
])
def test_completion_errors_name_the_field(server, body: dict, param: str) -> None:
    import httpx

    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_generate_returns_logits_on_request(server, hf, tok) -> None:
    import base64

    import httpx
    import numpy as np

    ids = tok.encode("Hello world")
    _, want = hf_greedy(hf, ids, 3, eos=False)
    body = {"model": MODEL, "inputs": {"prompt_ids": ids}, "sampling": {"temperature": 0, "max_tokens": 3, "ignore_eos": True}}
    plain = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60).json()
    assert "logits" not in plain["outputs"]
    r = httpx.post(f"{server.url}/v1/generate", json={**body, "kwargs": {"return_logits": True}}, timeout=60).json()
    t = r["outputs"]["logits"]
    got = np.frombuffer(base64.b64decode(t["data"]), dtype=t["dtype"]).reshape(t["shape"])
    torch.testing.assert_close(torch.from_numpy(got.copy()).reshape(want.shape), want, atol=1e-4, rtol=1e-4)


def test_chat_n_choices_whole_and_streamed(client, tok) -> None:
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=1.0, seed=5, n=3, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1
    assert whole.usage.prompt_tokens == len(prompt) and whole.usage.completion_tokens == 3 * 6
    streamed = ["", "", ""]
    finished = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert streamed == texts and finished == {0: "length", 1: "length", 2: "length"}


def test_stop_token_ends_with_stop_and_is_not_shown(client, hf, tok) -> None:
    prompt = "The quick brown fox"
    ids, _ = hf_greedy(hf, tok.encode(prompt), 8, eos=False)
    k = next(i for i in range(2, 8) if ids[i] not in ids[:i])  # its first occurrence ends the text
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"stop_token_ids": [ids[k]], "ignore_eos": True})
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text == tok.decode(ids[:k])


# ---- released layouts -----------------------------------------------------------------------

# mstar.testing.release_layouts transforms: Qwen3 text releases keep the template in
# tokenizer_config.json, say torch_dtype and shard their weights; a template only in the
# processor's chat_template.json is found too.
LAYOUTS = {
    "qwen3_release": ("template_in_tokenizer_config", "torch_dtype_key", "sharded"),
    "processor_template": ("template_in_chat_template_json",),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_released_layouts_warm_up_and_chat_equal_transformers(plugin, ckpt, hf, tok, tmp_path, layout) -> None:
    """The serve warm-up's own path (``load_adapter``, the warm-up request, ``chat_inputs``,
    the engine) on each layout, and a greedy chat equal to transformers generate."""
    from mstar import Engine
    from mstar.api.protocol import ChatCompletionRequest
    from mstar.server.preprocess import load_adapter
    from mstar.testing.release_layouts import variant_copy

    root = variant_copy(ckpt, tmp_path / layout, *LAYOUTS[layout])
    _, adapter = load_adapter(MODEL, root)
    warm = adapter.chat_inputs(adapter.warmup_request())
    chat = adapter.chat_inputs(ChatCompletionRequest(model=MODEL, messages=MESSAGES))
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert chat.inputs["prompt_ids"].tolist() == prompt
    with Engine.from_model(MODEL, weights=root) as engine:
        warmed, out = engine.run_batch([
            {"inputs": warm.inputs, "sampling": {"temperature": 0, "max_tokens": 2}},
            {"inputs": chat.inputs, "sampling": {"temperature": 0, "max_tokens": 12}},
        ])
    assert warmed.error is None and out.error is None, (warmed.error, out.error)
    want, _ = hf_greedy(hf, prompt, 12)
    ended = bool(want) and want[-1] == hf.config.eos_token_id
    assert out.cat("tokens").tolist() == (want[:-1] if ended else want)
    assert out.finish_reason == ("stop" if ended else "length")
