"""The clone encoders as engine nodes (Base): a request with ``ref_audio`` sends its clip's
features, and nodes ``speaker_encoder`` / ``codec_encoder`` compute its clone prompt in the
engine, batched across requests. A seeded clone gives the same bytes alone and when its clip
shares one encoder call (same length) or one engine forward (other lengths) with another
request's clip; a saved voice (its prompt made by the same nodes) speaks exactly as its clip inline."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch
from mstar.api.protocol import SpeechRequest
from mstar.api.voices import SavedVoice
from mstar_qwen3tts.adapter import Qwen3TTSApiAdapter
from mstar_qwen3tts.clone_prompt import ClonePrompt
from mstar_qwen3tts.config import load_config
from mstar_qwen3tts.encoder_nodes import build_codec_encoder, build_speaker_encoder, run_by_length
from mstar_qwen3tts.tiny_checkpoint import write_checkpoint
from qwen3tts_helpers import sampling

BATCH = 2
SEEDED = sampling({"seed": 31, "max_tokens": 10, "temperature": 0.9}, {"temperature": 0.9})


def _wav(seconds: float, seed: int, rate: int = 24000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    wave = (0.3 * np.sin(2 * np.pi * (140 + 50 * seed) * t) + 0.05 * noise).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format="WAV", subtype="FLOAT")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3tts-base-enc"), seed=5, kind="base",
                            overrides={"mstar_streaming": {"encoder_batch": BATCH}})


@pytest.fixture(scope="module")
def adapter(ckpt: Path) -> Qwen3TTSApiAdapter:
    return Qwen3TTSApiAdapter(load_config(ckpt), ckpt)


def _request(adapter: Qwen3TTSApiAdapter, text: str, clip: str, ref_text: str | None = None) -> dict[str, Any]:
    fields = {"ref_text": ref_text} if ref_text else {"x_vector_only_mode": True}
    made = adapter.speech_inputs(SpeechRequest.model_validate({"model": "m", "input": text, "ref_audio": clip, **fields}))
    return {"inputs": made.inputs, "kwargs": made.kwargs, "sampling": SEEDED}


def _audio_bytes(result: Any) -> bytes:
    assert result.error is None, result.error
    return result.cat("audio").numpy().tobytes()


def test_seeded_clones_equal_alone_and_in_one_encoder_forward(engines, ckpt: Path, adapter: Qwen3TTSApiAdapter) -> None:
    # Prefix caching off: its output cache would serve the clips' second run without any
    # encoder forward, and this test counts the forwards that batch them.
    engine = engines(ckpt, prefix_caching=False)
    speaker = engine.core.nodes["speaker_encoder"].submodule
    codec = engine.core.nodes["codec_encoder"].submodule
    assert speaker.batch == codec.batch == BATCH
    a = _request(adapter, "The first voice speaks.", _wav(0.6, 1), "one clip")
    b = _request(adapter, "A second voice answers.", _wav(0.6, 2), "another clip")  # same length as a
    c = _request(adapter, "And a third, shorter one.", _wav(0.45, 3))  # x-vector only, another length
    alone = [_audio_bytes(engine.run_batch([r])[0]) for r in (a, b, c)]
    stats = engine.core.stats.forwards_by_group
    before = (stats["speaker_encoder:encode_speaker"], stats["codec_encoder:encode_reference"], speaker.calls, codec.calls)
    together = [_audio_bytes(r) for r in engine.run_batch([a, b, c])]
    after = (stats["speaker_encoder:encode_speaker"], stats["codec_encoder:encode_reference"], speaker.calls, codec.calls)
    # One forward of each node for all three clips: a and b stacked in one call, c in its own.
    assert [y - x for x, y in zip(before, after, strict=True)] == [1, 1, 2, 1]
    assert together == alone
    assert len(set(alone)) == 3 and all(alone)  # three clips, three voices


def made_voice(engine: Any, voice: Any, others: list[dict[str, Any]] = ()) -> SavedVoice:  # type: ignore[assignment]
    """A voice's engine request (``EngineVoice``) run as the server runs it (beside
    ``others``), its outputs joined to the pool's tensors."""
    result = engine.run_batch([{"inputs": voice.inputs, "kwargs": voice.kwargs}, *others])[0]
    assert result.error is None, result.error
    assert set(result.signals) == set(voice.outputs) and all(len(v) == 1 for v in result.signals.values())
    return SavedVoice("v", {**voice.tensors, **{k: v[0] for k, v in result.signals.items()}})


@pytest.mark.parametrize("ref_text", ["the reference words", None])
def test_a_saved_voice_speaks_as_its_clip_inline(engines, ckpt: Path, adapter: Qwen3TTSApiAdapter, ref_text: str | None) -> None:
    """A saved voice (its clone prompt made by the encoder nodes in a request of its own,
    here beside another clone) == the same clip inline: the same bytes and talker logits."""
    engine = engines(ckpt)
    clip = _wav(0.5, 4)
    fields = {"ref_text": ref_text} if ref_text else {"x_vector_only_mode": True}
    voice = adapter.session_voice(SpeechRequest.model_validate({"model": "m", "input": "x", "ref_audio": clip, **fields}))
    assert voice is not None and set(voice.fields) == {"ref_audio", "ref_text", "x_vector_only_mode"}
    made = made_voice(engine, voice.voice, [_request(adapter, "Beside it.", _wav(0.5, 6), "other words")])
    assert ClonePrompt.from_tensors(made.tensors).x_vector_only_mode == (ref_text is None)
    saved = adapter.speech_inputs_with_voice(SpeechRequest.model_validate({"model": "m", "input": "Spoken twice."}), made)
    inline = _request(adapter, "Spoken twice.", clip, ref_text)
    assert "ref_mel" in inline["inputs"] and "ref_mel" not in saved.inputs
    # The talker's logits too: audio depends on the drawn codes only, which a small
    # difference in the prompt may leave unchanged.
    logits = {"return_logits": True}
    results = [engine.run_batch([r])[0] for r in ({**inline, "kwargs": {**inline["kwargs"], **logits}},
                                                    {"inputs": saved.inputs, "kwargs": logits, "sampling": SEEDED})]
    assert _audio_bytes(results[0]) == _audio_bytes(results[1])
    assert torch.equal(results[0].cat("logits"), results[1].cat("logits"))


def test_a_row_alone_equals_the_row_in_a_full_call(ckpt: Path) -> None:
    """``run_by_length``: a row's output does not depend on the rows beside it in a call."""
    config = load_config(ckpt)
    speaker, codec = build_speaker_encoder(config, ckpt, "cpu"), build_codec_encoder(config, ckpt, "cpu")
    g = torch.Generator().manual_seed(0)
    mels = [torch.randn(n, speaker.encoder.cfg.mel_dim, generator=g) - 3 for n in (30, 30, 30, 17)]
    waves = [0.2 * torch.randn(n, generator=g) for n in (4000, 4000, 2500)]
    for node, rows in ((speaker, mels), (codec, waves)):
        with torch.inference_mode():
            alone = [run_by_length([r], node.encode, 4)[0] for r in rows]
            batched = run_by_length(rows, node.encode, 4)
        assert all(torch.equal(x, y) for x, y in zip(alone, batched, strict=True))
        assert not torch.equal(batched[0], batched[1])  # different rows, different outputs


def test_bad_features_fail_their_request_alone(engines, ckpt: Path, adapter: Qwen3TTSApiAdapter) -> None:
    engine = engines(ckpt)
    good = _request(adapter, "Still spoken.", _wav(0.6, 5), "fine")
    bad = {**good, "inputs": {**good["inputs"], "ref_mel": good["inputs"]["ref_mel"][:, :3]}}
    unknown = {**good, "kwargs": {"clone_encode": "sometimes"}}
    results = engine.run_batch([bad, good, unknown])
    assert "ref_mel must be float" in (results[0].error or "")
    assert results[1].error is None and results[1].cat("audio").numel() > 0
    assert "clone_encode" in (results[2].error or "")


def test_a_clip_sent_again_is_not_encoded_again(engines, ckpt: Path, adapter: Qwen3TTSApiAdapter) -> None:
    """With prefix caching, the encoders keep their outputs by the clip's features: a request
    that sends the same clip again (another sentence in the same voice) runs neither encoder
    and speaks exactly as on an engine without the cache; another clip is encoded."""
    engine = engines(ckpt, prefix_caching=True)
    plain = engines(ckpt, prefix_caching=False)  # cold: caching is on by default
    speaker = engine.core.nodes["speaker_encoder"].submodule
    codec = engine.core.nodes["codec_encoder"].submodule
    clip = _wav(0.6, 4)
    first = _request(adapter, "A first sentence in this voice.", clip, "the clip's words")
    again = _request(adapter, "And a second one, same voice.", clip, "the clip's words")
    other = _request(adapter, "And a second one, same voice.", _wav(0.6, 5), "the clip's words")
    heard = [engine.run_batch([first])[0]]
    calls = (speaker.calls, codec.calls)
    heard.append(engine.run_batch([again])[0])
    assert (speaker.calls, codec.calls) == calls  # nothing encoded
    heard.append(engine.run_batch([other])[0])
    assert (speaker.calls, codec.calls) == (calls[0] + 1, calls[1] + 1)
    # The talker shares the voice's prompt prefix too: audio within float rounding of a cold engine.
    for result, request in zip(heard, (first, again, other), strict=True):
        ref = plain.run_batch([request])[0]
        assert result.error is None and ref.error is None
        torch.testing.assert_close(result.cat("audio"), ref.cat("audio"), rtol=0, atol=1e-5)
