"""Regenerate the qwen-tts parity fixtures under tests/qwen3tts/fixtures/.

For each checkpoint variant: write the tiny random checkpoint (our writer, fixed seed),
run the qwen-tts 0.1.1 reference on it in its own venv (``--ref-python``), and save the
reference outputs with the cases and a digest of the checkpoint's tensors, so the tests
rebuild the same checkpoint and notice if it ever changes. Use ``make_fixtures.sh``,
which also builds the reference venv.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mstar_qwen3tts.tiny_checkpoint import tensors_digest, write_checkpoint
from safetensors.torch import load_file, save_file

SEED = 7
MAX_NEW_TOKENS = 8  # qwen-tts emits MAX_NEW_TOKENS - 1 complete frames (or fewer at EOS)

# "proj": the code predictor is narrower than the talker (like 1.7B: a projection bridges);
# "same": equal widths (like 0.6B: no projection).
VARIANTS: dict[str, dict] = {
    "proj": {},
    "same": {"talker_config": {"code_predictor_config": {"hidden_size": 32, "intermediate_size": 64,
                                                         "num_attention_heads": 4, "num_key_value_heads": 2}}},
    # CustomVoice 1.7B (instructions are honoured), Base (voice clone), VoiceDesign.
    "instruct": {"tts_model_size": "1b7"},
    "base": {},
    "design": {"tts_model_size": "1b7"},
}
KINDS = {"base": "base", "design": "voice_design"}  # default: custom_voice

# One 2 s clip at 16 kHz (resampled to 24 kHz for both encoders: 25 reference frames) and
# one 0.5 s clip at 24 kHz (no resampling).
_CLIP = {"ref_sr": 16000, "ref_seconds": 2.0, "ref_seed": 3}
_CLIP24 = {"ref_sr": 24000, "ref_seconds": 0.5, "ref_seed": 5}
CLONE_CASES = [
    {"name": "xvector_full_text", "mode": "clone", "text": "Hello there, world!", "language": "English",
     "non_streaming_mode": True, **_CLIP},
    {"name": "xvector_incremental_auto", "mode": "clone", "text": "Hi, 你好 123.", "language": "Auto",
     "non_streaming_mode": False, **_CLIP24},
    {"name": "icl_full_text", "mode": "clone", "text": "Hello there, world!", "language": "English",
     "non_streaming_mode": True, "ref_text": "the river at noon", **_CLIP24},
    # Text longer than the reference codes (7 frames): the rest trails one token per step.
    {"name": "icl_incremental_long_text", "mode": "clone", "text": "Hello there, the world on the river at noon!",
     "language": "English", "non_streaming_mode": False, "ref_text": "we set sail", **_CLIP24},
    # Reference codes (25 frames) longer than the text: text pads fill in.
    {"name": "icl_incremental_long_ref", "mode": "clone", "text": "Hi", "language": "Chinese",
     "non_streaming_mode": False, "ref_text": "ok", **_CLIP},
]
DESIGN_CASES = [
    {"name": "design_full_text", "mode": "design", "text": "Hello there, world!", "language": "English",
     "instruct": "A warm, low voice; speaks slowly.", "non_streaming_mode": True},
    {"name": "design_incremental_auto", "mode": "design", "text": "Hi, 你好 123.", "language": "Auto",
     "instruct": "Bright and fast.", "non_streaming_mode": False},
]
INSTRUCT_CASES = [
    {"name": "instruct_full_text", "mode": "custom_voice", "text": "Hello there, world!", "speaker": "ryan",
     "language": "English", "instruct": "Very happy.", "non_streaming_mode": True},
    {"name": "instruct_dialect_incremental", "mode": "custom_voice", "text": "你好, the river 42", "speaker": "eric",
     "language": "Chinese", "instruct": "Whisper.", "non_streaming_mode": False},
]
VARIANT_CASES = {"instruct": INSTRUCT_CASES, "base": CLONE_CASES, "design": DESIGN_CASES}

CASES = [
    {"name": "english_full_text", "text": "Hello there, world!", "speaker": "vivian", "language": "English",
     "non_streaming_mode": True},
    {"name": "english_incremental", "text": "Hello there, world!", "speaker": "Ryan", "language": "english",
     "non_streaming_mode": False},
    {"name": "dialect_auto_full_text", "text": "Hi, 你好 123.", "speaker": "dylan", "language": "Auto",
     "non_streaming_mode": True},
    {"name": "dialect_chinese_incremental", "text": "你好, the river 42", "speaker": "eric", "language": "Chinese",
     "non_streaming_mode": False},
]


def make_variant(name: str, ref_python: str, out_dir: Path, work: Path) -> None:
    kind = KINDS.get(name, "custom_voice")
    ckpt = write_checkpoint(work / name, preset="tiny", seed=SEED, overrides=VARIANTS[name], kind=kind)
    cases = [{**c, "max_new_tokens": MAX_NEW_TOKENS} for c in VARIANT_CASES.get(name, CASES)]
    cases_path = work / f"{name}-cases.json"
    cases_path.write_text(json.dumps(cases))
    raw = work / f"{name}-reference.safetensors"
    script = Path(__file__).with_name("qwen_tts_reference.py")
    subprocess.run([ref_python, str(script), str(ckpt), str(cases_path), str(raw)], check=True)
    digest = {
        "model.safetensors": tensors_digest(load_file(str(ckpt / "model.safetensors"))),
        "speech_tokenizer/model.safetensors": tensors_digest(load_file(str(ckpt / "speech_tokenizer/model.safetensors"))),
    }
    meta = {"seed": SEED, "preset": "tiny", "overrides": VARIANTS[name], "kind": kind, "cases": cases, "digest": digest,
            "reference": "qwen-tts 0.1.1, transformers 4.57.3, torch float32 on CPU"}
    save_file(load_file(str(raw)), str(out_dir / f"{name}.safetensors"), metadata={"meta": json.dumps(meta)})
    print(f"wrote {out_dir / (name + '.safetensors')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ref-python", required=True, help="python of the venv holding qwen-tts 0.1.1")
    parser.add_argument("--out", type=Path, default=Path("tests/qwen3tts/fixtures"))
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: all")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen3tts-fixtures-") as tmp:
        for name in args.variant or sorted(VARIANTS):
            make_variant(name, args.ref_python, args.out, Path(tmp))
    return None


if __name__ == "__main__":
    sys.exit(main())
