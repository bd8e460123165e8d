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
# it), GPU_CHECK_SMOKE=1 (CPU, tiny sizes, the existing environment, no install),
# GPU_CHECK_STAGES (default: all; a space-separated subset of the stage names below),
# GPU_CHECK_OMNI_ARGS (qwen3omni_modes.py's arguments beside --size/--device).
# Not covered: Qwen3-TTS against qwen-tts (its reference needs an environment of its own).
# Ran once on an H200 (2026-12-04, stages gpu_tests flashinfer qwen3omni_modes engine_overhead):
# benchmarks/results/gpu_check_2026-12-04.json holds what it printed and what was fixed after.
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
  # FlashInfer compiles its kernels on first use (44 s on the H200 for tests/core/attention);
  # a cache brought back from an earlier lease ($OUT/fi_cache.tgz) skips that.
  export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
  [ -f .whl/flashinfer_jit_cache.tgz ] && tar xzf .whl/flashinfer_jit_cache.tgz -C /tmp
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
fi

stages="${GPU_CHECK_STAGES:-gpu_tests flashinfer qwen3omni_modes orpheus_tts engine_overhead}"
stage() {  # stage NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, record its exit status
  local name=$1 limit=$2
  shift 2
  case " $stages " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name ($limit s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/stages.txt"
  tail -n 25 "$OUT/$name.log"
}

: >"$OUT/stages.txt"
# captured == eager, FlashInfer == torch backend, seeded rows independent of position, preemption
stage gpu_tests 150 "$PYTHON" -m pytest tests/gpu tests/core/sampling/test_sampling_cuda.py -q -p no:cacheprovider -o addopts="" --durations=8
# FlashInfer == torch backend (only where flashinfer-python came in .whl/: it compiles its kernels on first use)
stage flashinfer 120 "$PYTHON" -m pytest tests/core/attention/test_flashinfer_backend.py -q -p no:cacheprovider -o addopts="" -rs
# Qwen3-Omni, five modes, mstar ÷ transformers (throughput, TTFT / time to first audio)
# shellcheck disable=SC2086
omni_args="${GPU_CHECK_OMNI_ARGS:---concurrency $concurrency}"
stage qwen3omni_modes 260 "$PYTHON" benchmarks/qwen3omni_modes.py --size "$size" --device "$device" $omni_args
stage orpheus_tts 60 "$PYTHON" benchmarks/orpheus_tts.py --device "$device" --concurrency 8 --repeats 1
stage engine_overhead 30 "$PYTHON" benchmarks/engine_overhead.py --layers 2 --hidden 64 --tokens 64 --rounds 1

[ "$smoke" != 1 ] && [ -d /tmp/fiws ] && (cd /tmp && tar czf "$OUT/fi_cache.tgz" fiws)

echo
echo "== summary (logs in $OUT)"
cat "$OUT/stages.txt"
for name in gpu_tests flashinfer; do
  [ -f "$OUT/$name.log" ] && grep -h -E "passed|failed|skipped|error" "$OUT/$name.log" | tail -n 1
done
for name in qwen3omni_modes orpheus_tts engine_overhead; do
  [ -f "$OUT/$name.log" ] || continue
  echo "-- $name"
  grep -E "[0-9]x\)|^ *[0-9]+ \||engine/bare|equal|differ" "$OUT/$name.log" | tail -n 20
done
