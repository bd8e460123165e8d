#!/usr/bin/env bash
# The GPU evidence of one lease, in one command (issue #32, part 4): installs this checkout
# into the machine's own Python (no network: missing packages come as wheels in .whl/, made
# here by benchmarks/gpu_wheels.sh), runs tests/gpu, then the timed comparisons, and prints
# one table at the end. Budget: about 8 minutes on one H200; each stage has its own timeout,
# so a stage that hangs costs only its share and the table still prints.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine, from the repository root
#   GPU_CHECK_SMOKE=1 bash benchmarks/gpu_check.sh   # here, on the CPU: the plumbing only
#
# Environment: PYTHON (default python3), OUT (default ./gpu_check_out; the device tool sets
# it), GPU_CHECK_SMOKE=1 (CPU, tiny sizes, the existing environment, no install).
# Not covered: Qwen3-TTS against qwen-tts (its reference needs an environment of its own).
# Status: written 2026-12-04 without a GPU; it has not run on one yet (its CPU smoke mode has).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$root/gpu_check_out}"
mkdir -p "$OUT"
smoke="${GPU_CHECK_SMOKE:-0}"
device=cuda size=mid concurrency="1 32"
if [ "$smoke" = 1 ]; then device=cpu size=small concurrency="1 2"; fi
export PYTHONUNBUFFERED=1

if [ "$smoke" != 1 ]; then
  site=/tmp/mstar-site
  if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
  fi
  for dist in mstar-core mstar-models-orpheus mstar-models-qwen3tts mstar-models-qwen3omni mstar-models-vjepa2 examples/mstar-models-toy; do
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" "./$dist" || exit 1
  done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi

stage() {  # stage NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, record its exit status
  local name=$1 limit=$2
  shift 2
  echo "== $name ($limit s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/stages.txt"
  tail -n 25 "$OUT/$name.log"
}

: >"$OUT/stages.txt"
# captured == eager, FlashInfer == torch backend, seeded rows independent of position, preemption
stage gpu_tests 120 "$PYTHON" -m pytest tests/gpu -q -p no:cacheprovider -o addopts=""
# Qwen3-Omni, five modes, mstar ÷ transformers (throughput, TTFT / time to first audio)
# shellcheck disable=SC2086
stage qwen3omni_modes 260 "$PYTHON" benchmarks/qwen3omni_modes.py --size "$size" --device "$device" --concurrency $concurrency
stage orpheus_tts 60 "$PYTHON" benchmarks/orpheus_tts.py --device "$device" --concurrency 8 --repeats 1
stage engine_overhead 30 "$PYTHON" benchmarks/engine_overhead.py --layers 2 --hidden 64 --tokens 64 --rounds 1

echo
echo "== summary (logs in $OUT)"
cat "$OUT/stages.txt"
grep -h -E "passed|failed|skipped" "$OUT/gpu_tests.log" | tail -n 1
for name in qwen3omni_modes orpheus_tts engine_overhead; do
  echo "-- $name"
  grep -E "[0-9]x\)|^ *[0-9]+ \||engine/bare|equal|differ" "$OUT/$name.log" | tail -n 20
done
