"""Max abs errors against the qwen-tts 0.1.1 fixtures of the base, design and instruct variants
(what tests/qwen3tts/test_qwen3tts_variants_parity.py asserts within tolerances), printed as
numbers: speaker embedding, prefill embeddings, talker and code-predictor logits, audio; and
whether the greedy codes and the encoder's reference codes are identical; then the base cases
again with the clip's features encoded by the engine's encoder nodes.

    OMP_NUM_THREADS=1 .venv/bin/python mstar-models-qwen3tts/tools/measure_variant_parity.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "qwen3tts"))
import test_qwen3tts_variants_parity as t
import torch
from mstar import Engine
from qwen3tts_helpers import LogitRecorder, frames, greedy
from qwen3tts_reference import load_reference

root = Path(tempfile.mkdtemp())
err = {k: 0.0 for k in ("speaker", "prefill", "talker", "predictor", "audio")}
codes_equal, ref_codes_equal = True, True
for variant, cases in t.VARIANT_CASES.items():
    ref = load_reference(variant, root)
    eng = Engine.from_model("qwen3tts", weights=ref.ckpt)
    for name in cases:
        case = t._case(ref, name)
        if case.get("mode") == "clone":
            cp = t.clone_prompt(ref, case)
            err["speaker"] = max(err["speaker"], (cp.speaker_embed - ref.get(name, "speaker_embed")).abs().max().item())
            if case.get("ref_text"):
                ref_codes_equal &= torch.equal(cp.ref_codes, ref.get(name, "ref_codes"))
        inp = t.case_inputs(ref, case)
        talker = eng.core.nodes["talker"].submodule
        e = talker.prompt_embeds(inp["text_ids"], inp["codec_ids"], inp["trailing_ids"], inp.get("speaker_embed"), inp.get("ref_codes"))
        err["prefill"] = max(err["prefill"], (e - ref.get(name, "prefill_embeds")).abs().max().item())
        with LogitRecorder(eng) as rec:
            r = eng.run_batch([{"inputs": inp, "sampling": greedy(case["max_new_tokens"])}])[0]
        wt, wp = ref.get(name, "talker_logits"), ref.get(name, "predictor_logits")
        err["talker"] = max(err["talker"], (rec.talker_logits()[: len(wt)] - wt).abs().max().item())
        err["predictor"] = max(err["predictor"], (rec.predictor_logits()[: len(wp)] - wp).abs().max().item())
        wc = ref.get(name, "codes")
        codes_equal &= torch.equal(frames(r, wc.shape[1])[: len(wc)], wc)
        wa = ref.get(name, "audio")
        err["audio"] = max(err["audio"], (r.cat("audio")[: len(wa)] - wa).abs().max().item())
    eng.close()
print({k: f"{v:.2e}" for k, v in err.items()}, "greedy codes equal:", codes_equal, "ref codes equal:", ref_codes_equal)

# Base again, the clip's features through the engine's encoder nodes (what an inline ref_audio runs).
from test_qwen3tts_encoder_nodes_parity import node_request  # noqa: E402

node_err = {k: 0.0 for k in ("talker", "predictor", "audio")}
node_codes_equal = True
ref = load_reference("base", root)
eng = Engine.from_model("qwen3tts", weights=ref.ckpt)
for name in t.VARIANT_CASES["base"]:
    with LogitRecorder(eng) as rec:
        r = eng.run_batch([node_request(ref, t._case(ref, name))])[0]
    wt, wp, wc, wa = (ref.get(name, k) for k in ("talker_logits", "predictor_logits", "codes", "audio"))
    node_err["talker"] = max(node_err["talker"], (rec.talker_logits()[: len(wt)] - wt).abs().max().item())
    node_err["predictor"] = max(node_err["predictor"], (rec.predictor_logits()[: len(wp)] - wp).abs().max().item())
    node_codes_equal &= torch.equal(frames(r, wc.shape[1])[: len(wc)], wc)
    node_err["audio"] = max(node_err["audio"], (r.cat("audio")[: len(wa)] - wa).abs().max().item())
eng.close()
print("base through the encoder nodes:", {k: f"{v:.2e}" for k, v in node_err.items()}, "greedy codes equal:", node_codes_equal)
