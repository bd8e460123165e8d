#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.sh: the packages mstar needs that the H200 machine's image
# (Python 3.12, torch, transformers, numpy, pillow, httpx, ... as /work/.library/device/KINDS.md
# lists) lacks, downloaded here into .whl/ (git-ignored), carried with `run(carry=[".whl"])`.
#   bash benchmarks/gpu_wheels.sh [--flashinfer]
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
need=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn httptools websockets
      pyzmq msgspec python-multipart soundfile cffi pycparser soxr av snac)
if [ "${1:-}" = --flashinfer ]; then need+=(flashinfer-python); fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${need[@]}"
du -sh .whl
