"""qwen-tts 0.1.1's own generate, timed for benchmarks/qwen3tts_tts.py (runs in its venv).

``python qwen_tts_bench_reference.py CHECKPOINT FRAMES CONCURRENCY...`` prints one JSON
line per concurrency: wall seconds of a batched ``generate_custom_voice`` of that many
texts, and the audio seconds of each. qwen-tts returns audio only when the whole batch is
done, so its time to first audio is that wall time.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from qwen_tts_reference import _stub_25hz_only_modules

TEXTS = [f"Benchmark sentence number {i}, spoken at a steady pace." for i in range(64)]


def main(checkpoint: str, frames: str, *concurrencies: str) -> None:
    _stub_25hz_only_modules()
    from qwen_tts import Qwen3TTSModel

    torch.manual_seed(0)
    wrapper = Qwen3TTSModel.from_pretrained(checkpoint, dtype=torch.float32)
    talker = wrapper.model.config.talker_config
    # A never-sampled EOS (the pad id is suppressed) makes every utterance run the full
    # length; max_new_tokens N gives N - 1 complete frames in qwen-tts.
    kw = {"max_new_tokens": int(frames) + 1, "eos_token_id": talker.codec_pad_id}
    wrapper.generate_custom_voice(text=TEXTS[0], speaker="vivian", language="English", **kw)  # warm-up
    for c in map(int, concurrencies):
        texts = TEXTS[:c]
        start = time.perf_counter()
        wavs, sr = wrapper.generate_custom_voice(text=texts, speaker=["vivian"] * c, language=["English"] * c, **kw)
        wall = time.perf_counter() - start
        print(json.dumps({"concurrency": c, "wall_s": wall, "audio_s": [len(w) / sr for w in wavs]}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
