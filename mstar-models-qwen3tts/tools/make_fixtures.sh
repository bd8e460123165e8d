#!/usr/bin/env bash
# Regenerates tests/qwen3tts/fixtures/ against the qwen-tts 0.1.1 reference.
# qwen-tts pins transformers 4.57.3, so it runs in a throw-away venv (REF_VENV) of its own.
# Usage (from the repo root, after scripts/setup.sh): bash mstar-models-qwen3tts/tools/make_fixtures.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
ref="${REF_VENV:-/tmp/qwen-tts-ref}"
if [ ! -x "$ref/bin/python" ] || ! "$ref/bin/python" -c "import qwen_tts, transformers" 2>/dev/null; then
  python3 -m venv "$ref"
  # torch from the local CPU build (the same version as the project's venv).
  "$ref/bin/pip" install --quiet -c constraints.txt torch==2.13.0 transformers==4.57.3 accelerate==1.12.0 \
    librosa soundfile einops safetensors
  # --no-deps: qwen-tts also wants torchaudio/onnxruntime/sox/gradio, used only by its
  # 25 Hz tokenizer and demo; the reference script stubs them.
  "$ref/bin/pip" install --quiet --no-deps qwen-tts==0.1.1
fi
.venv/bin/python mstar-models-qwen3tts/tools/make_fixtures.py --ref-python "$ref/bin/python" --out tests/qwen3tts/fixtures "$@"
