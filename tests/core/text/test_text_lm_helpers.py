"""mstar.text.lm declarations: config with generation config, end ids, graph."""

from __future__ import annotations

import json

from mstar.text.lm import PROMPT, STEP_OUTPUTS, load_text_config, text_lm_graph, text_lm_samplers


def test_end_ids_come_from_config_and_generation_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5], "temperature": 0.6}))
    config = load_text_config(tmp_path)
    decl = text_lm_samplers(config, max_tokens=9)["lm"]
    assert decl.stop_token_ids == (5, 7)
    assert (decl.vocab_size, decl.main.max_tokens, decl.prompt_signal) == (10, 9, PROMPT)


def test_graph_validates_and_every_step_output_is_a_client_signal() -> None:
    graph = text_lm_graph("lm")
    graph.validate()
    assert graph.request_inputs == (PROMPT,)
    assert all(graph.signals[s].to_client for s in STEP_OUTPUTS)
    assert graph.signals["tokens"].persist
