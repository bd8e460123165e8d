"""Codecs on a CUDA device: fixed-size batched calls keep a row's bytes whatever shares the
call (Qwen3-TTS codec chunks, SNAC windows), and the stateful stream equals the whole
decode. Skipped without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar.layers.streaming import StreamState

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

BATCH = 8


@pytest.fixture(scope="module")
def qwen_codec(tmp_path_factory: pytest.TempPathFactory):
    from mstar.weights import load_weights
    from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS
    from mstar_qwen3tts.codec_node import CodecNode
    from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path_factory.mktemp("qwen3tts-mid"), preset="mid")
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    node = CodecNode(cfg.codec, batch=BATCH)
    load_weights(node, ckpt / CODEC_DIR, **CODEC_KEYS)
    return node.cuda().eval()


def test_qwen3tts_chunk_bytes_do_not_depend_on_the_company(qwen_codec) -> None:
    node = qwen_codec
    g = torch.Generator().manual_seed(0)
    q, v = node.cfg.num_quantizers, node.cfg.codebook_size
    mine = torch.randint(0, v, (4 + 12 * 4, q), generator=g).cuda()
    sizes = [4, 12, 12, 12, 12]

    def streamed(company: int) -> torch.Tensor:
        others = [torch.randint(0, v, mine.shape, generator=g).cuda() for _ in range(company)]
        states = [StreamState() for _ in range(company + 1)]
        audio, start = [], 0
        for size in sizes:
            chunks = [o[start : start + size] for o in others]
            chunks.insert(company // 2, mine[start : start + size])
            out, states = node.decode_chunks(chunks, states)
            audio.append(out[company // 2])
            start += size
        return torch.cat(audio).cpu()

    with torch.inference_mode():
        runs = [streamed(company) for company in (0, 1, 5, 7, 10)]  # 10: mine shares the second call of two
        # Streamed == whole holds up to float32 rounding; cuDNN's default TF32 convolutions
        # round differently for each input length (up to 0.028 apart on an H200, 2026-12-04),
        # so this comparison runs in full float32.
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            exact, whole = streamed(0), node.decode(mine).cpu()
    for run in runs[1:]:
        assert run.numpy().tobytes() == runs[0].numpy().tobytes()
    torch.testing.assert_close(exact, whole, atol=1e-4, rtol=0)


def test_snac_window_bytes_do_not_depend_on_the_company(tmp_path: Path) -> None:
    from mstar_orpheus.checkpoint import write_checkpoint
    from mstar_orpheus.config import SNAC_DIR, load_config
    from mstar_orpheus.snac_model import load_snac_weights
    from mstar_orpheus.snac_node import SnacNode

    ckpt = write_checkpoint(tmp_path)
    node = SnacNode(load_config(ckpt)["snac"], batch=BATCH)
    load_snac_weights(node.snac, ckpt / SNAC_DIR)
    node = node.cuda().eval()
    g = torch.Generator().manual_seed(0)
    size = node.snac_cfg.codebook_size
    mine = torch.randint(0, size, (28,), generator=g)
    runs = []
    with torch.inference_mode():
        for company in (0, 1, 5, 7, 12):
            others = torch.randint(0, size, (company, 28), generator=g)
            windows = torch.cat([others[: company // 2], mine[None], others[company // 2 :]]).cuda()
            runs.append(node.decode_windows(windows)[0][company // 2].cpu())
    for run in runs[1:]:
        assert run.numpy().tobytes() == runs[0].numpy().tobytes()
