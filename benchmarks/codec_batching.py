"""Codec throughput with requests batched into fixed-size calls vs one call per request:
``--streams`` concurrent streams decoded step by step, as the engine feeds the codec nodes.

    .venv/bin/python benchmarks/codec_batching.py [--streams 8] [--device cpu|cuda] [--threads N]

- Qwen3-TTS (mid preset codec, real 1920 samples per frame): every stream sends its
  4-frame first chunk, then 12-frame chunks (stateful), ``--chunks`` steps.
- Orpheus SNAC (24 kHz, decoder width ``--snac-dim``; 1024 is the released width): every
  stream sends one 28-code window per step, ``--windows`` steps.

For each: seconds for all streams with ``batch=1`` (today's one-request-per-call) and with
``batch=streams`` (one padded call per step), their ratio, and whether one stream's bytes
are the same in both batched layouts tried (alone in a padded call vs with the others).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from mstar.layers.streaming import StreamState


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def qwen3tts(streams: int, chunks: int, device: torch.device) -> dict[str, float | bool]:
    from mstar.weights import load_weights
    from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS
    from mstar_qwen3tts.codec_node import CodecNode
    from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(Path(tmp), preset="mid")
        cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
        nodes = {}
        for batch in (1, streams):
            node = CodecNode(cfg.codec, batch=batch)
            load_weights(node, ckpt / CODEC_DIR, **CODEC_KEYS)
            nodes[batch] = node.to(device).eval()
    q, v = cfg.codec.num_quantizers, cfg.codec.codebook_size
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, v, (4 + 12 * (chunks - 1), q), generator=g).to(device) for _ in range(streams)]
    bounds = [(0, 4)] + [(4 + 12 * i, 16 + 12 * i) for i in range(chunks - 1)]

    def run(node: CodecNode, rows: list[int]) -> tuple[float, list[torch.Tensor]]:
        states = [StreamState() for _ in rows]
        out: list[list[torch.Tensor]] = [[] for _ in rows]
        _sync(device)
        t0 = time.perf_counter()
        for a, b in bounds:
            if node.batch == 1:  # one call per request, as without batching
                for j, r in enumerate(rows):
                    (audio,), (states[j],) = node.decode_chunks([codes[r][a:b]], [states[j]])
                    out[j].append(audio)
            else:
                audio, states = node.decode_chunks([codes[r][a:b] for r in rows], states)
                for j in range(len(rows)):
                    out[j].append(audio[j])
        _sync(device)
        return time.perf_counter() - t0, [torch.cat(o).cpu() for o in out]

    with torch.inference_mode():
        run(nodes[1], [0])  # warm-up
        run(nodes[streams], [0])
        t1, _ = run(nodes[1], list(range(streams)))
        tb, batched = run(nodes[streams], list(range(streams)))
        _, alone = run(nodes[streams], [0])
    same = alone[0].numpy().tobytes() == batched[0].numpy().tobytes()
    return {"unbatched_s": t1, "batched_s": tb, "speedup": t1 / tb, "bytes_equal": same}


def snac(streams: int, windows: int, dim: int, device: torch.device) -> dict[str, float | bool]:
    from mstar_orpheus.checkpoint import SNAC_24KHZ
    from mstar_orpheus.snac_node import SnacNode

    nodes = {}
    torch.manual_seed(0)
    base = SnacNode({**SNAC_24KHZ, "decoder_dim": dim}, batch=1)
    for batch in (1, streams):
        node = SnacNode({**SNAC_24KHZ, "decoder_dim": dim}, batch=batch)
        node.load_state_dict(base.state_dict())
        nodes[batch] = node.to(device).eval()
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, SNAC_24KHZ["codebook_size"], (windows, streams, 28), generator=g).to(device)

    def run(node: SnacNode, rows: int) -> tuple[float, torch.Tensor]:
        out = []
        _sync(device)
        t0 = time.perf_counter()
        for step in codes:
            if node.batch == 1:
                out.append(torch.cat([node.decode_windows(step[r : r + 1])[0] for r in range(rows)]))
            else:
                out.append(node.decode_windows(step[:rows])[0])
        _sync(device)
        return time.perf_counter() - t0, torch.stack(out).cpu()

    with torch.inference_mode():
        run(nodes[1], 1)
        run(nodes[streams], 1)
        t1, _ = run(nodes[1], streams)
        tb, batched = run(nodes[streams], streams)
        _, alone = run(nodes[streams], 1)
    same = alone[:, 0].numpy().tobytes() == batched[:, 0].numpy().tobytes()
    return {"unbatched_s": t1, "batched_s": tb, "speedup": t1 / tb, "bytes_equal": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=6, help="Qwen3-TTS chunks per stream")
    parser.add_argument("--windows", type=int, default=10, help="SNAC windows per stream")
    parser.add_argument("--snac-dim", type=int, default=256, help="SNAC decoder width (released: 1024)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"{args.streams} streams, {device}, {torch.get_num_threads()} threads")
    for name, r in (("qwen3tts codec", qwen3tts(args.streams, args.chunks, device)),
                    (f"snac ({args.snac_dim}-wide)", snac(args.streams, args.windows, args.snac_dim, device))):
        print(f"  {name:<18} one call per request {r['unbatched_s']:7.3f} s | batched {r['batched_s']:7.3f} s | "
              f"x{r['speedup']:.2f} | a stream's bytes alone == in company: {r['bytes_equal']}")


if __name__ == "__main__":
    main()
