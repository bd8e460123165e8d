#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.sh: the packages mstar needs that the H200 machine's image
# (Python 3.12, torch, transformers, numpy, pillow, httpx, ... as /work/.library/device/KINDS.md
# lists) lacks, downloaded here into .whl/ (git-ignored), carried with `run(carry=[".whl"])`.
#   bash benchmarks/gpu_wheels.sh [--flashinfer]
# --flashinfer: 0.6.0, the newest whose wheel fits the 64 MiB a device call may carry (0.7.4
# is 101 MB); it compiles its kernels with the machine's nvcc on first use.
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
# transformers: the image's 5.17 predates VideoProcessorMixin (5.19), which the Qwen3-Omni
# plugin needs; 5.24 is the newest that takes the image's huggingface-hub 1.33. No `av`
# (35 MB, imported only to decode video files, which the check does not send).
need=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn httptools websockets
      pyzmq msgspec python-multipart soundfile cffi pycparser soxr snac transformers==5.24.0)
if [ "${1:-}" = --flashinfer ]; then need+=(flashinfer-python==0.6.0 "apache-tvm-ffi<0.2,>=0.1.6"); fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${need[@]}"
du -sh .whl
