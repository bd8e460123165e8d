"""mstar.text.lm declarations: config with generation config, end ids, graph."""

from __future__ import annotations

import json

from mstar.text.lm import (
    END_IDS,
    PROMPT,
    STEP_OUTPUTS,
    end_token_ids,
    load_text_config,
    text_lm_graph,
    text_lm_samplers,
)


def hf_end_ids(root) -> list[int]:
    """The end ids transformers' generate stops on for a checkpoint directory: its
    generation_config.json, or without one the generation config made from config.json."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(root)
    except OSError:
        gen = GenerationConfig.from_pretrained(root, config_file_name="config.json", _from_model_config=True)
    eos = gen.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def test_end_ids_are_the_ones_transformers_generate_stops_on(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [7, 5], "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    config = load_text_config(tmp_path)
    decl = text_lm_samplers(config, max_tokens=9)["lm"]
    assert list(decl.stop_token_ids) == hf_end_ids(tmp_path) == [7, 5]
    assert (decl.vocab_size, decl.main.max_tokens, decl.prompt_signal) == (10, 9, PROMPT)
    assert (decl.main.temperature, decl.main.top_k, decl.main.top_p) == (0.6, 20, 0.95)
    greedy = text_lm_samplers({**config, "generation_config": {"do_sample": False, "temperature": 0.7}}, temperature=1.0)
    assert greedy["lm"].main.temperature == 1.0  # a plugin default wins over the checkpoint's
    assert text_lm_samplers({**config, "generation_config": {"do_sample": False}})["lm"].main.temperature == 0.0
    (tmp_path / "generation_config.json").unlink()  # then config.json's, as transformers makes it
    assert list(text_lm_samplers(load_text_config(tmp_path))["lm"].stop_token_ids) == hf_end_ids(tmp_path) == [5]


def test_end_ids_fall_back_to_the_reference_default_then_config_then_tokenizer(tmp_path) -> None:
    """A generation_config.json without eos_token_id: the model's reference default (a plugin
    states it), else config.json's, else the tokenizer's eos_token (as vLLM adds it)."""
    from mstar.text.tiny_tokenizer import write_tiny_tokenizer
    from transformers import AutoTokenizer

    tok = write_tiny_tokenizer(tmp_path)  # eos_token <|im_end|>
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 384, "eos_token_id": 381}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert load_text_config(tmp_path, reference_end_ids=382)[END_IDS] == [382]
    assert load_text_config(tmp_path, reference_end_ids=[382, 9999])[END_IDS] == [382]  # outside the vocabulary
    # a reference default wholly outside the vocabulary: the reference never stops, nor do we
    assert load_text_config(tmp_path, reference_end_ids=9999)[END_IDS] == []
    assert load_text_config(tmp_path)[END_IDS] == [381]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 380}))
    assert load_text_config(tmp_path, reference_end_ids=382)[END_IDS] == [380]
    # a reference that passes its ids to generate: they win over the file, as a generate kwarg does
    assert end_token_ids(load_text_config(tmp_path), reference_end_ids=382, reference_passes_them=True) == (382,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 384}))
    want = AutoTokenizer.from_pretrained(tmp_path).eos_token_id
    assert load_text_config(tmp_path)[END_IDS] == [want] == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert end_token_ids({"vocab_size": 384}) == ()  # no checkpoint, no ids: never an invented stop


def test_graph_validates_and_every_step_output_is_a_client_signal() -> None:
    graph = text_lm_graph("lm")
    graph.validate()
    assert graph.request_inputs == (PROMPT,)
    assert all(graph.signals[s].to_client for s in STEP_OUTPUTS)
    assert graph.signals["tokens"].persist
