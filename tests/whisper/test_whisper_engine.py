"""An encoder–decoder model through the real engine: the fixture Whisper plugin's greedy ids
and per-step logits against transformers' ``generate`` on the same checkpoint, alone, in a
batch of 8 arriving at different steps, and under preemption; its cross-attention caches
held in the KV pool (counted, freed, rewritten after preemption)."""

from __future__ import annotations

import threading

import pytest
import torch
from mstar import Engine

transformers = pytest.importorskip("transformers")

TAILS = ([], [3, 41], [7], [60, 61, 62, 63])  # after <|startoftranscript|>
NEW = 12


def prompt_of(config: dict, seed: int) -> list[int]:
    return [config["decoder_start_token_id"], *TAILS[seed % len(TAILS)]]


def features(config: dict, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(config["num_mel_bins"], 2 * config["max_source_positions"], generator=g)


def request(config: dict, seed: int, new: int = NEW) -> dict:
    prompt = prompt_of(config, seed)
    return {"inputs": {"input_features": features(config, seed), "prompt_ids": torch.tensor(prompt)},
            "sampling": {"temperature": 0, "max_tokens": new, "ignore_eos": True}, "kwargs": {"return_logits": True}}


def reference(hf, config: dict, seed: int, new: int = NEW) -> tuple[list[int], torch.Tensor]:
    """transformers generate for one request alone: (new ids, [steps, vocab] logits)."""
    prompt = prompt_of(config, seed)
    with torch.no_grad():
        out = hf.generate(input_features=features(config, seed)[None], decoder_input_ids=torch.tensor([prompt]),
                          max_new_tokens=new, min_new_tokens=new, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, suppress_tokens=None, begin_suppress_tokens=None)
    ids = out.sequences[0].tolist()
    ids = ids[len(prompt):] if ids[: len(prompt)] == prompt else ids  # with or without the prompt
    return ids, torch.cat(out.logits)


@pytest.fixture(scope="module")
def config(whisper_plugin, whisper_ckpt):
    return whisper_plugin.spec.load_config(whisper_ckpt)


def engine(ckpt, **kw) -> Engine:
    return Engine.from_model("tinywhisper", weights=ckpt, **kw)


def check(result, hf, config: dict, seed: int, new: int = NEW) -> None:
    assert result.error is None, result.error
    ids, logits = reference(hf, config, seed, new)
    assert result.cat("tokens").tolist() == ids
    got = torch.stack(result.signals["logits"])
    torch.testing.assert_close(got, logits, rtol=1e-4, atol=1e-4)


def test_greedy_ids_and_logits_equal_generate_alone(whisper_ckpt, whisper_hf, config) -> None:
    e = engine(whisper_ckpt, kv_budget_bytes=1 << 22)
    try:
        distinct = set()
        for seed in range(4):
            [result] = e.run_batch([request(config, seed)])
            check(result, whisper_hf, config, seed)
            distinct.add(tuple(result.cat("tokens").tolist()))
        assert len(distinct) > 1, "every input gave the same tokens: the test would not see the audio"
        assert e.core.nodes["decoder"].kv.num_used_blocks == 0  # self and cross caches freed
    finally:
        e.close()


def test_batch_of_8_with_staggered_arrivals(whisper_ckpt, whisper_hf, config) -> None:
    """Requests join a running batch at different steps (prefills beside decodes, rows whose
    cross caches are written while others only read theirs)."""
    e = engine(whisper_ckpt, kv_budget_bytes=1 << 22)
    handles = []
    arrivals = {1: [1, 2], 3: [3], 4: [4, 5], 7: [6, 7]}  # step -> seeds
    step = [0]
    lock = threading.Lock()

    def on_step() -> None:
        step[0] += 1
        for seed in arrivals.get(step[0], []):
            with lock:
                handles.append((seed, e.add_request(**request(config, seed))))

    e.add_step_listener(on_step)
    try:
        with lock:
            handles.append((0, e.add_request(**request(config, 0))))
        while True:
            with lock:
                if len(handles) == 8:
                    break
            threading.Event().wait(0.01)
        batches = []
        for seed, h in handles:
            tokens, logits = [], []
            while True:
                out = h.queue.get(timeout=60)
                if out.signal == "tokens":
                    tokens.append(int(out.data))
                elif out.signal == "logits":
                    logits.append(out.data)
                if out.finished:
                    assert out.error is None, out.error
                    break
            ids, ref = reference(whisper_hf, config, seed)
            assert tokens == ids, seed
            torch.testing.assert_close(torch.stack(logits), ref, rtol=1e-4, atol=1e-4)
            batches.append(seed)
        assert sorted(batches) == list(range(8))
        assert e.core.stats.last_batch_size >= 1
        assert max(e.core.stats.forwards_by_group.values()) < 8 * NEW, "the requests never shared a forward"
    finally:
        e.close()


def test_preemption_frees_and_rewrites_cross_caches(whisper_ckpt, whisper_hf, config) -> None:
    """A pool of 11 blocks of 16 positions: each request ends holding 4 cross blocks (50
    encoder states) and 2 self blocks (up to 29 positions), so 8 requests cannot all run;
    preempted ones recompute their caches, cross caches written again from the encoder
    states they still hold."""
    per_block = 2 * 2 * 16 * 4 * 8 * 4  # K and V x layers x block x kv heads x head_dim x float32
    e = engine(whisper_ckpt, kv_budget_bytes=11 * per_block)
    try:
        assert e.core.nodes["decoder"].kv.num_blocks == 11
        results = e.run_batch([request(config, seed, new=24) for seed in range(8)])
        assert e.core.stats.preemptions > 0
        for seed, result in enumerate(results):
            check(result, whisper_hf, config, seed, new=24)
        assert e.core.nodes["decoder"].kv.num_used_blocks == 0
    finally:
        e.close()


def test_cross_caches_count_in_the_kv_pool(whisper_ckpt, config) -> None:
    """After the prefill, a request holds its 50 cross positions (4 blocks) beside its self
    positions; the engine's KV stats report the cross blocks."""
    e = engine(whisper_ckpt, kv_budget_bytes=1 << 22)
    seen = []

    def on_step() -> None:
        kv = e.core.nodes["decoder"].kv
        seen.append((kv.num_used_blocks, e.stats()["kv"]["decoder"].get("cross_blocks")))

    e.add_step_listener(on_step)
    try:
        req = request(config, 0)
        req["sampling"]["max_tokens"] = 2
        [result] = e.run_batch([req])
        assert result.error is None
        # step 1: the encoder; step 2: the prefill (1 self block + 4 cross blocks).
        assert (5, 4) in seen, seen
    finally:
        e.close()


def test_the_decoder_prompt_defaults_to_the_checkpoints_start_token(whisper_ckpt, whisper_hf, config) -> None:
    """``prompt_ids`` is optional (GraphSpec.input_defaults): left out, the request decodes
    from <|startoftranscript|> alone, as one that gives it."""
    e = engine(whisper_ckpt, kv_budget_bytes=1 << 22)
    try:
        given = request(config, 0)  # seed 0's prompt is the start token alone
        left_out = request(config, 0)
        del left_out["inputs"]["prompt_ids"]
        results = e.run_batch([given, left_out])
        check(results[1], whisper_hf, config, 0)
        assert results[1].cat("tokens").tolist() == results[0].cat("tokens").tolist()
    finally:
        e.close()


def test_missing_or_malformed_encoder_states_fail_the_request_alone(whisper_ckpt, whisper_hf, config) -> None:
    e = engine(whisper_ckpt, kv_budget_bytes=1 << 22)
    try:
        bad = request(config, 0)
        bad["inputs"]["input_features"] = torch.zeros(3, 5)
        good = request(config, 1)
        results = e.run_batch([bad, good])
        assert results[0].error is not None and "input_features must be" in results[0].error
        assert results[0].error_type == "invalid_request"
        check(results[1], whisper_hf, config, 1)
    finally:
        e.close()


def test_check_plugin_passes(whisper_site) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(whisper_site), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mstar.cli.main", "check-plugin", "tinywhisper"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "tinywhisper: all 15 checks passed" in proc.stdout, proc.stdout + proc.stderr


def test_the_plugin_is_at_most_300_lines() -> None:
    """Issue #35's target for an encoder-decoder ASR plugin written on core (hooks, both
    nodes, the transcription adapter and the tiny-checkpoint writer included)."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "whisper" / "fixture_whisper"
    assert sum(len(p.read_text().splitlines()) for p in package.glob("*.py")) <= 300
