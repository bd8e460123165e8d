"""Qwen3-TTS from the tiny checkpoint the qwen-tts fixtures were made on (``same``: the 0.6B
CustomVoice shape), rewritten into the layouts releases use (``mstar.testing.release_layouts``).
The writer already writes ``Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice``'s files (``vocab.json`` +
``merges.txt`` + ``tokenizer_config.json`` and no ``tokenizer.json``, ``generation_config.json``,
``torch_dtype``, ``speech_tokenizer/``); here also ``dtype`` (transformers >= 4.56 configs) and
sharded talker weights. In each: the serve warm-up's own path (``load_adapter``, the adapter's
warm-up request, ``speech_inputs``, the engine) succeeds, and a request's token ids, greedy
codes and audio equal qwen-tts's recorded ones."""

from __future__ import annotations

import pytest
import torch
from mstar import Engine
from mstar.testing.release_layouts import variant_copy
from qwen3tts_helpers import frames, greedy, speech_inputs, token_ids
from qwen3tts_reference import load_reference

LAYOUTS = {"dtype_key": ("dtype_key",), "sharded": ("sharded",)}
CASE = "english_full_text"
AUDIO_ATOL = 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_warms_up_and_matches_qwen_tts(reference_root, tmp_path, layout) -> None:
    from mstar.server.preprocess import load_adapter

    ref = load_reference("same", reference_root)
    root = variant_copy(ref.ckpt, tmp_path / layout, *LAYOUTS[layout])
    case = next(c for c in ref.meta["cases"] if c["name"] == CASE)
    assert token_ids(root, case["text"]) == ref.get(CASE, "input_ids").tolist()
    _, adapter = load_adapter("qwen3tts", root)  # as `mstar serve` builds it
    warm_request = adapter.warmup_request()
    warm = adapter.speech_inputs(warm_request)
    n = len(ref.get(CASE, "codes"))
    inputs = speech_inputs(root, case["text"], case["speaker"], case["language"], case["non_streaming_mode"])
    with Engine.from_model("qwen3tts", weights=root) as engine:
        warm_frames = {"temperature": 0, "max_tokens": warm_request.max_tokens, "min_tokens": warm_request.min_tokens}
        warmed, result = engine.run_batch([
            {"inputs": warm.inputs, "kwargs": warm.kwargs, "sampling": {"talker": {"main": warm_frames}}},
            {"inputs": inputs, "sampling": greedy(n)},
        ])
    assert warmed.error is None and result.error is None, (warmed.error, result.error)
    assert warmed.cat("audio").numel() > 0
    groups = ref.get(CASE, "codes").shape[1]
    assert torch.equal(frames(result, groups)[:n], ref.get(CASE, "codes"))
    torch.testing.assert_close(result.cat("audio"), ref.get(CASE, "audio"), atol=AUDIO_ATOL, rtol=0)
