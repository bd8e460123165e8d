"""Orpheus from its tiny checkpoint rewritten into the layouts releases use
(``mstar.testing.release_layouts``): ``canopylabs/orpheus-3b-0.1-ft`` ships sharded weights
(an index and two shards) and says ``torch_dtype``; checkpoints saved by transformers >= 4.56
say ``dtype``. In each: the serve warm-up's own path (``load_adapter``, the adapter's warm-up
request, ``speech_inputs``, the engine) succeeds, greedy tokens equal transformers generate
and the audio equals the official decoder over ``snac`` (int16, off by at most 1); the end
ids are end-of-speech and the ones transformers reads from the checkpoint (the official
pipeline's vLLM stops on those too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mstar import Engine
from mstar.testing.release_layouts import variant_copy
from orpheus_reference import END_OF_SPEECH, engine_int16, hf_greedy, official_stream_audio

LAYOUTS = {
    "release": ("sharded", "torch_dtype_key"),
    "dtype_key": ("dtype_key",),
}
GREEDY = {"temperature": 0, "repetition_penalty": 1.3, "max_tokens": 64}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_orpheus.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("orpheus-written"), seed=3, snac={"noise": False})


def transformers_end_ids(root: Path) -> list[int]:
    """What transformers' generate stops on for ``root``: generation_config.json's end ids,
    else those of the generation config it makes from config.json."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(root).eos_token_id
    except OSError:
        eos = GenerationConfig.from_pretrained(root, config_file_name="config.json", _from_model_config=True).eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_warms_up_and_speaks_as_the_reference(written, tmp_path, layout) -> None:
    from mstar.server.preprocess import load_adapter

    root = variant_copy(written, tmp_path / layout, *LAYOUTS[layout])
    _, adapter = load_adapter("orpheus", root)  # as `mstar serve` builds it
    warm = adapter.speech_inputs(adapter.warmup_request())
    with Engine.from_model("orpheus", weights=root) as engine:
        assert engine.built.node_samplers["lm"].stop_token_ids == (END_OF_SPEECH, *transformers_end_ids(root))
        warmed, result = engine.run_batch([
            {"inputs": warm.inputs, "sampling": {"temperature": 0, "max_tokens": 36}},
            {"inputs": warm.inputs, "sampling": GREEDY},
        ])
    assert warmed.error is None and result.error is None, (warmed.error, result.error)
    prompt = warm.inputs["prompt_ids"].tolist()
    ref_tokens = hf_greedy(root, prompt, GREEDY["max_tokens"], repetition_penalty=GREEDY["repetition_penalty"])
    assert result.cat("token").tolist() == ref_tokens
    ref = official_stream_audio(root, ref_tokens)
    ours = engine_int16(result.cat("audio"))
    assert len(ref) >= 2048 and ours.shape == ref.shape
    assert int(np.abs(ours.astype(np.int32) - ref.astype(np.int32)).max()) <= 1
    assert warmed.cat("token").tolist() == ref_tokens[:36]  # the warm-up's sampling: the plugin's defaults, greedy
