"""Batched stateful codec: chunks of several requests share fixed-size decoder calls, and a
seeded request's audio stays byte-identical whatever shares its calls."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mstar.layers.streaming import StreamState
from mstar.weights import load_weights
from mstar_qwen3tts.checkpoint_keys import CODEC_DIR, CODEC_KEYS
from mstar_qwen3tts.codec_node import CodecNode
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import sampling, speech_inputs

BATCH = 4


@pytest.fixture(scope="module")
def batched_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3tts-batched"), overrides={"mstar_streaming": {"codec_batch": BATCH}})


def _codec(ckpt: Path, batch: int) -> CodecNode:
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    node = CodecNode(cfg.codec, batch=batch)
    load_weights(node, ckpt / CODEC_DIR, **CODEC_KEYS)
    return node


def test_a_row_decodes_to_the_same_bytes_in_any_company(batched_ckpt) -> None:
    """The same stream, decoded in fixed-size calls beside fresh and advanced streams at
    different positions, gives identical bytes; and equals its whole decode."""
    node = _codec(batched_ckpt, BATCH)
    g = torch.Generator().manual_seed(0)
    q, v = node.cfg.num_quantizers, node.cfg.codebook_size
    mine = torch.randint(0, v, (4 + 12 * 3, q), generator=g)
    sizes = [4, 12, 12, 12]
    runs = []
    with torch.inference_mode():
        for company in range(BATCH):  # 0..3 other streams, mine at position `company`
            others = [torch.randint(0, v, (4 + 12 * 3, q), generator=g) for _ in range(company)]
            states = [StreamState() for _ in range(company + 1)]
            for k in range(company):  # advance some neighbours so they sit at other offsets
                if k % 2:
                    _, (states[k],) = node.decode_chunks([others[k][:4]], [states[k]])
            audio, start = [], 0
            for size in sizes:
                chunks = [o[start : start + size] for o in others]
                chunks.insert(company, mine[start : start + size])
                out, states = node.decode_chunks(chunks, states)
                audio.append(out[company])
                start += size
            runs.append(torch.cat(audio))
        whole = node.decode(mine)
    for run in runs[1:]:
        assert run.numpy().tobytes() == runs[0].numpy().tobytes()
    torch.testing.assert_close(runs[0], whole, atol=1e-5, rtol=0)


def test_more_rows_than_the_batch_split_into_calls(batched_ckpt) -> None:
    node = _codec(batched_ckpt, BATCH)
    calls: list[int] = []
    node.decoder.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    codes = [torch.randint(0, node.cfg.codebook_size, (n, node.cfg.num_quantizers)) for n in [12] * 6 + [5, 4]]
    with torch.inference_mode():
        audio, _ = node.decode_chunks(codes, [StreamState() for _ in codes])
        assert calls == [BATCH, BATCH, BATCH, BATCH]  # six 12-frame chunks, one 5, one 4
        alone = [node.decode(c) for c in codes]
    for a, b in zip(audio, alone, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_seeded_audio_is_byte_identical_under_load_with_batched_codec(engines, batched_ckpt, monkeypatch) -> None:
    engine = engines(batched_ckpt)
    node = engine.core.nodes["codec"].submodule
    assert node.batch == BATCH
    rows: list[int] = []
    decode_chunks = node.decode_chunks
    monkeypatch.setattr(node, "decode_chunks", lambda c, s: (rows.append(len(c)), decode_chunks(c, s))[1])
    seeded = {"inputs": speech_inputs(batched_ckpt, "Under load."), "sampling": sampling({"seed": 77, "max_tokens": 20}, {})}
    alone = engine.run_batch([seeded])[0]
    assert alone.error is None and alone.cat("audio").numel() > 0
    others = [
        {"inputs": speech_inputs(batched_ckpt, f"Other request {i}.", "ryan" if i % 2 else "vivian", "auto", i % 3 != 0),
         "sampling": sampling({"max_tokens": 8 + 5 * i, **({"seed": i} if i % 2 else {})}, {"temperature": 1.1})}
        for i in range(6)
    ]
    loaded = engine.run_batch([*others[:2], seeded, *others[2:]])
    assert all(r.error is None for r in loaded)
    assert max(rows) > 1, "the codec never decoded two requests in one call"
    assert torch.equal(loaded[2].cat("codes"), alone.cat("codes"))
    assert loaded[2].cat("audio").numpy().tobytes() == alone.cat("audio").numpy().tobytes()


def test_first_chunks_and_later_chunks_take_their_own_call_sizes(batched_ckpt) -> None:
    """Streams at their first chunk share calls of ``first_batch`` rows, the others calls of
    ``batch`` rows, even at equal chunk lengths; every row equals its decode alone."""
    cfg = Qwen3TTSConfig.from_dict(load_config(batched_ckpt))
    node = CodecNode(cfg.codec, batch=BATCH, first_batch=1)
    load_weights(node, batched_ckpt / CODEC_DIR, **CODEC_KEYS)
    calls: list[int] = []
    node.decoder.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    g = torch.Generator().manual_seed(3)
    q, v = cfg.codec.num_quantizers, cfg.codec.codebook_size
    streams = [torch.randint(0, v, (16, q), generator=g) for _ in range(3)]
    with torch.inference_mode():
        _, (advanced,) = node.decode_chunks([streams[0][:4]], [StreamState()])
        calls.clear()
        audio, _ = node.decode_chunks([streams[0][4:], streams[1][:12], streams[2][:12]], [advanced, StreamState(), StreamState()])
        assert sorted(calls) == [1, 1, BATCH]  # two fresh streams alone, the continuing one padded
        whole = [node.decode(streams[0])[4 * node.decoder.samples_per_frame :], node.decode(streams[1][:12]), node.decode(streams[2][:12])]
    for a, b in zip(audio, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_cpu_default_batches_later_chunks_and_keeps_seeded_audio(engines, tiny_ckpt, monkeypatch) -> None:
    """The CPU default (no ``codec_batch`` in the config): first chunks alone, later chunks in
    calls of 4, the codec beside the talker (overlap_nodes); a seeded request's audio is
    byte-identical alone and among requests that share its codec calls."""
    engine = engines(tiny_ckpt)
    assert engine.core.scheduler.config.overlap_nodes  # the plugin's engine default
    node = engine.core.nodes["codec"].submodule
    assert (node.batch, node.first_batch) == (4, 1)
    shared: list[int] = []
    decoder_forward = node.decoder.forward

    def spy(codes, state=None):
        shared.append(codes.shape[0])
        return decoder_forward(codes, state)

    monkeypatch.setattr(node.decoder, "forward", spy)
    seeded = {"inputs": speech_inputs(tiny_ckpt, "Seeded under load."), "sampling": sampling({"seed": 5, "max_tokens": 30}, {})}
    alone = engine.run_batch([seeded])[0]
    assert alone.error is None and alone.cat("audio").numel() > 0
    others = [
        {"inputs": speech_inputs(tiny_ckpt, f"Other request {i}.", "ryan" if i % 2 else "vivian"),
         "sampling": sampling({"max_tokens": 16 + 7 * i, "seed": 100 + i}, {"temperature": 1.1})}
        for i in range(5)
    ]
    shared.clear()
    loaded = engine.run_batch([*others[:2], seeded, *others[2:]])
    assert all(r.error is None for r in loaded)
    assert torch.equal(loaded[2].cat("codes"), alone.cat("codes"))
    assert loaded[2].cat("audio").numpy().tobytes() == alone.cat("audio").numpy().tobytes()
    assert set(shared) == {1, 4}, shared  # fresh streams alone, the others in padded calls of 4
