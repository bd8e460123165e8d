"""Start-up time of ``mstar serve`` on the Qwen3-TTS mid-size random checkpoint, then the wall
time of its first rounds of 8 (and one of 3) concurrent 40-frame requests: whether the first
client batch still waits for compiles the warm-up did not do. Extra arguments go to
``mstar serve``:

    .venv/bin/python benchmarks/qwen3tts_first_batch.py --engine-option compile_regions=true
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mstar.bench import LocalServer  # noqa: E402
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint  # noqa: E402
from qwen3tts_tts import run_server  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="qwen3tts-first-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "mid", preset="mid", seed=0)
        start = time.perf_counter()
        with LocalServer(["--model", "qwen3tts", "--weights", str(ckpt), "--log-level", "warning", *sys.argv[1:]]) as url:
            print(f"start-up {time.perf_counter() - start:.1f} s", flush=True)
            for i, concurrency in enumerate([8, 8, 8, 3]):
                start = time.perf_counter()
                r = run_server(url, 40, concurrency)
                print(f"round {i}, {concurrency} requests: wall {time.perf_counter() - start:.2f} s, "
                      f"mean TTFA {r['ttfa_s']:.3f} s", flush=True)


if __name__ == "__main__":
    main()
