"""Qwen3-TTS's clone encoder nodes on a CUDA device, at their CUDA default of 8-row calls: a
clip's outputs (x-vector, reference codes) are the same bytes whatever other clips share
its call (the seeds contract for clones under load). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory):
    from mstar_qwen3tts.config import load_config
    from mstar_qwen3tts.encoder_nodes import build_codec_encoder, build_speaker_encoder
    from mstar_qwen3tts.tiny_checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path_factory.mktemp("qwen3tts-base-cuda"), kind="base")
    config = load_config(ckpt)
    cuda = (build_speaker_encoder(config, ckpt, "cuda"), build_codec_encoder(config, ckpt, "cuda"))
    assert all(n.batch == 8 for n in cuda)
    return cuda


@pytest.mark.parametrize("which", [0, 1], ids=["speaker_encoder", "codec_encoder"])
def test_a_clip_is_the_same_bytes_in_any_company(nodes, which: int) -> None:
    from mstar_qwen3tts.encoder_nodes import run_by_length

    cuda = nodes[which]
    g = torch.Generator().manual_seed(0)

    def clip() -> torch.Tensor:
        if which == 0:
            return torch.randn(40, cuda.encoder.cfg.mel_dim, generator=g) - 3
        return 0.2 * torch.randn(6000, generator=g)

    mine = clip()
    runs = []
    with torch.inference_mode():
        for company in (0, 1, 7, 10):  # 10: mine shares the second call of two
            rows = [clip().cuda() for _ in range(company)]
            rows.insert(company // 2, mine.cuda())
            runs.append(run_by_length(rows, cuda.encode, cuda.batch)[company // 2].cpu())
    for run in runs[1:]:
        assert run.numpy().tobytes() == runs[0].numpy().tobytes()
    assert runs[0].numel() > 0
