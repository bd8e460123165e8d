"""mstar.text.lm declarations: config with generation config, end ids, graph."""

from __future__ import annotations

import json

from mstar.text.lm import PROMPT, STEP_OUTPUTS, load_text_config, text_lm_graph, text_lm_samplers


def test_end_ids_come_from_config_and_generation_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [7, 5], "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    config = load_text_config(tmp_path)
    decl = text_lm_samplers(config, max_tokens=9)["lm"]
    assert decl.stop_token_ids == (5, 7)
    assert (decl.vocab_size, decl.main.max_tokens, decl.prompt_signal) == (10, 9, PROMPT)
    assert (decl.main.temperature, decl.main.top_k, decl.main.top_p) == (0.6, 20, 0.95)
    greedy = text_lm_samplers({**config, "generation_config": {"do_sample": False, "temperature": 0.7}}, temperature=1.0)
    assert greedy["lm"].main.temperature == 1.0  # a plugin default wins over the checkpoint's
    assert text_lm_samplers({**config, "generation_config": {"do_sample": False}})["lm"].main.temperature == 0.0


def test_graph_validates_and_every_step_output_is_a_client_signal() -> None:
    graph = text_lm_graph("lm")
    graph.validate()
    assert graph.request_inputs == (PROMPT,)
    assert all(graph.signals[s].to_client for s in STEP_OUTPUTS)
    assert graph.signals["tokens"].persist
