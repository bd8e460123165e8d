"""Issue #35's outside-author target: a Phi-3 plugin written from docs/ alone.

`tests/fixtures/plugins/phi3_text` (model `tinyphi3`: fused qkv_proj / gate_up_proj, partial
rotary, longrope, a sliding window) is built as a real wheel and installed into a temporary
site folder, then: `mstar check-plugin` passes; greedy ids and per-step logits through
`mstar.Engine` equal transformers' `Phi3ForCausalLM.generate` on the checkpoint the plugin
writes while the sequence stays below `original_max_position_embeddings`, and equal
transformers' forward stepped token by token on its cache when the generation crosses it;
the plugin stays within 120 lines of Python.

Known difference (strict xfail below): past the switch, transformers' Phi-3 `generate` drops
its cache and recomputes every earlier position with `long_factor`; the engine keeps the keys
it wrote with `short_factor`, so ids and logits part from `generate` after the switch.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "phi3_text"
PACKAGE = FIXTURE / "fixture_phi3"
MAX_LINES = 120
TOL = 1e-4


def _pip(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture built as a wheel (from a copy, so no build/ lands in the tree) and installed."""
    work = tmp_path_factory.mktemp("phi3_plugin")
    src, wheels, target = work / "src", work / "wheels", work / "site"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src), cwd=work)
    (wheel,) = wheels.glob("*.whl")
    _pip("install", "--no-deps", "--no-index", "--target", str(target), str(wheel), cwd=work)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))


@pytest.fixture(scope="module")
def checkpoint(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixture_phi3.plugin import write_tiny_checkpoint

    assert Path(importlib.import_module("fixture_phi3").__file__).is_relative_to(site)
    ckpt = tmp_path_factory.mktemp("tinyphi3")
    write_tiny_checkpoint(ckpt)
    return ckpt


def test_check_plugin_passes(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    mstar = Path(sys.executable).with_name("mstar")
    proc = subprocess.run([str(mstar), "check-plugin", "tinyphi3"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tinyphi3: all 15 checks passed" in proc.stdout, proc.stdout
    assert "FAIL" not in proc.stdout and "SKIP" not in proc.stdout


def test_plugin_is_at_most_120_lines() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    assert files and lines <= MAX_LINES, f"{lines} lines in {[f.name for f in files]}"


def test_checkpoint_has_what_the_tests_rely_on(checkpoint: Path) -> None:
    from mstar.api.text_adapter import TextLMAdapter
    from mstar.text.lm import load_text_config

    cfg = load_text_config(checkpoint)
    assert cfg["architectures"] == ["Phi3ForCausalLM"]
    assert cfg["rope_parameters"]["rope_type"] == "longrope" and cfg["partial_rotary_factor"] == 0.5
    assert cfg["original_max_position_embeddings"] == 64 and cfg["max_position_embeddings"] == 256
    assert cfg["sliding_window"] == 48
    TextLMAdapter(checkpoint, cfg)  # the tokenizer serving needs is there and fits the vocabulary


EOS = 383  # the checkpoint's end id: suppressed on both sides (min_tokens / min_new_tokens)
SWITCH = 64  # original_max_position_embeddings: longrope's short -> long factors


@pytest.fixture(scope="module")
def engine(checkpoint: Path):
    from mstar import Engine

    eng = Engine.from_model("tinyphi3", weights=checkpoint)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    from transformers import Phi3ForCausalLM

    return Phi3ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


def _prompt(n: int) -> list[int]:
    return torch.randint(2, EOS, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _mstar(engine, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    ids, logits = [], []
    sampling = {"temperature": 0, "max_tokens": n, "min_tokens": n}
    for event in engine.generate({"prompt_ids": torch.tensor(prompt)}, sampling, kwargs={"return_logits": True}):
        if event.signal == "tokens":
            ids += torch.as_tensor(event.data).reshape(-1).tolist()
        elif event.signal == "logits":
            logits.append(torch.as_tensor(event.data, dtype=torch.float32).reshape(-1))
    return ids, torch.stack(logits)


def _generate(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' own generate (greedy; raw logits of each step)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=n, min_new_tokens=n,
            output_logits=True, return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float()


def _stepped(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' forward, the prompt then one token at a time on its cache, never recomputed."""
    ids, logits = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            row = out.logits[0, -1].float()
            logits.append(row)
            ids.append(int(row.masked_fill(torch.arange(row.numel()) == EOS, float("-inf")).argmax()))
            out = model(input_ids=torch.tensor([ids[-1:]]), cache=out.cache, use_cache=True)
    return ids, torch.stack(logits)


def _assert_equal(ids, logits, ref_ids, ref_logits, n: int) -> None:
    assert len(ref_ids) == n and ids == ref_ids
    assert logits.shape == ref_logits.shape == (n, 384)
    assert ref_logits.std() > 0.5  # weights large enough that the comparison means something
    torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=TOL)


# (prompt length, new tokens), all below longrope's switch: short, and a prompt past the
# sliding window (48) whose last step reads position 62
@pytest.mark.parametrize(("prompt_len", "new"), [(10, 20), (50, 14)])
def test_below_the_switch_equals_generate(engine, reference, prompt_len: int, new: int) -> None:
    assert prompt_len + new - 1 < SWITCH
    prompt = _prompt(prompt_len)
    _assert_equal(*_mstar(engine, prompt, new), *_generate(reference, prompt, new), new)


CROSSING = (50, 30)  # positions 50..78: 15 steps below the switch, 15 at or past it


def test_crossing_the_switch_equals_transformers_stepped(engine, reference) -> None:
    """Past original_max_position_embeddings each new token rotates with long_factor while the
    cached keys keep the short_factor rotation they were written with: transformers' forward
    stepped on its cache, token by token (reference.md, RotaryEmbedding)."""
    prompt_len, new = CROSSING
    assert prompt_len < SWITCH <= prompt_len + new - 1
    prompt = _prompt(prompt_len)
    _assert_equal(*_mstar(engine, prompt, new), *_stepped(reference, prompt, new), new)


@pytest.mark.xfail(strict=True, reason=(
    "transformers' Phi3ForCausalLM.prepare_inputs_for_generation drops the cache when the sequence "
    "first reaches original_max_position_embeddings + 1 and recomputes every position with "
    "long_factor; mstar.layers.RotaryEmbedding decides per token and keeps the short-factor keys"))
def test_crossing_the_switch_equals_generate(engine, reference) -> None:
    prompt_len, new = CROSSING
    prompt = _prompt(prompt_len)
    ids, logits = _mstar(engine, prompt, new)
    ref_ids, ref_logits = _generate(reference, prompt, new)
    before = SWITCH - prompt_len  # the steps that read positions below the switch agree
    assert ids[:before] == ref_ids[:before]
    torch.testing.assert_close(logits[:before], ref_logits[:before], atol=TOL, rtol=TOL)
    _assert_equal(ids, logits, ref_ids, ref_logits, new)
