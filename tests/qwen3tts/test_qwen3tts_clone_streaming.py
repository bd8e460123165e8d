"""Streaming a cloned voice (Base, in-context mode): the codec decodes the generated frames
after the reference codes and drops their audio. Streamed chunks must equal one whole decode
of reference + generated frames (cut after the reference) on a long input, with the stateful
codec and with the re-decoding one; and a seeded cloned request must give the same bytes
alone and among other requests sharing the codec's fixed-size calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from mstar_qwen3tts.clone_prompt import CloneEncoder, ClonePrompt
from mstar_qwen3tts.config import Qwen3TTSConfig, load_config
from mstar_qwen3tts.prompt import build_clone_prompt
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import frames, sampling, speech_inputs, token_ids

FRAMES = 60  # past several chunks, and past the first chunk's reference priming
BATCH = 4


def _clip(seconds: float, rate: int, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.05 * noise).astype(np.float32)


@pytest.fixture(scope="module")
def base_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3tts-base")
    streaming = {"stateful": {}, "redecode": {"stateful": False}, "batched": {"codec_batch": BATCH}}
    return {name: write_checkpoint(root / name, seed=11, kind="base", overrides={"mstar_streaming": s})
            for name, s in streaming.items()}


@pytest.fixture(scope="module")
def clones(base_ckpts) -> dict[str, ClonePrompt]:
    enc = CloneEncoder.from_checkpoint(base_ckpts["stateful"])
    return {
        "icl": enc.encode(_clip(1.2, 16000, 1), 16000, "the river at noon"),
        "icl_other": enc.encode(_clip(0.7, 24000, 2), 24000, "hello"),
        "xvec": enc.encode(_clip(0.5, 22050, 3), 22050, x_vector_only_mode=True),
    }


def _inputs(ckpt: Path, clone: ClonePrompt, text: str, non_streaming_mode: bool = True) -> dict[str, torch.Tensor]:
    cfg = Qwen3TTSConfig.from_dict(load_config(ckpt))
    return build_clone_prompt(cfg, token_ids(ckpt, text), clone.speaker_embed, clone.ref_codes,
                              clone.ref_text_ids.tolist(), "english", non_streaming_mode).inputs()


def _fixed_length(n: int, seed: int = 5) -> dict:
    return sampling({"max_tokens": n, "min_tokens": n, "seed": seed}, {})


@pytest.mark.parametrize("codec", ["stateful", "redecode"])
@pytest.mark.parametrize("non_streaming_mode", [True, False])
def test_streamed_clone_equals_whole_decode_after_the_reference(engines, base_ckpts, clones, codec: str,
                                                                 non_streaming_mode: bool) -> None:
    ckpt, clone = base_ckpts[codec], clones["icl"]
    engine = engines(ckpt)
    result = engine.run_batch([{"inputs": _inputs(ckpt, clone, "A long sentence, so the seams show.", non_streaming_mode),
                                "sampling": _fixed_length(FRAMES)}])[0]
    assert result.error is None, result.error
    assert len(result.signals["audio"]) > 4  # several chunks: several seams
    node = engine.core.nodes["codec"].submodule
    gen = frames(result, clone.ref_codes.shape[1])
    assert gen.shape[0] == FRAMES
    with torch.inference_mode():
        whole = node.decode(torch.cat([clone.ref_codes, gen]))[clone.ref_codes.shape[0] * node.decoder.samples_per_frame :]
        unprimed = node.decode(gen)
    streamed = result.cat("audio")
    assert streamed.numel() == FRAMES * node.decoder.samples_per_frame
    torch.testing.assert_close(streamed, whole, atol=1e-5, rtol=0)
    assert (streamed - unprimed).abs().max() > 1e-3  # the reference codes really condition the decode


def test_seeded_clone_is_byte_identical_alone_and_under_load(engines, base_ckpts, clones, monkeypatch) -> None:
    ckpt = base_ckpts["batched"]
    engine = engines(ckpt)
    node = engine.core.nodes["codec"].submodule
    assert node.batch == BATCH
    rows: list[int] = []
    decode_chunks = node.decode_chunks
    monkeypatch.setattr(node, "decode_chunks", lambda c, s: (rows.append(len(c)), decode_chunks(c, s))[1])
    seeded = {"inputs": _inputs(ckpt, clones["icl"], "Under load, the same voice."),
              "sampling": sampling({"seed": 77, "max_tokens": 30, "temperature": 0.9}, {"temperature": 0.9})}
    alone = engine.run_batch([seeded])[0]
    assert alone.error is None and alone.cat("audio").numel() > 0
    others = [
        {"inputs": _inputs(ckpt, clones["icl_other" if i % 2 else "xvec"], f"Other request {i}.", non_streaming_mode=i % 3 != 0),
         "sampling": sampling({"max_tokens": 8 + 5 * i, **({"seed": i} if i % 2 else {})}, {"temperature": 1.1})}
        for i in range(6)
    ]
    loaded = engine.run_batch([*others[:2], seeded, *others[2:]])
    assert all(r.error is None for r in loaded), [r.error for r in loaded]
    assert max(rows) > 1, "the codec never decoded two requests in one call"
    assert torch.equal(loaded[2].cat("codes"), alone.cat("codes"))
    assert loaded[2].cat("audio").numpy().tobytes() == alone.cat("audio").numpy().tobytes()


def test_customvoice_graph_takes_no_clone_inputs(engines, tiny_ckpt) -> None:
    engine = engines(tiny_ckpt)
    assert "speaker_embed" not in engine.built.graph.request_inputs
    result = engine.run_batch([{"inputs": speech_inputs(tiny_ckpt, "Hi."), "sampling": _fixed_length(3)}])[0]
    assert result.error is None
