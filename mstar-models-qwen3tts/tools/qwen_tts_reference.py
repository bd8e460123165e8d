"""Runs the qwen-tts 0.1.1 reference on a checkpoint and saves what the parity tests compare.

Runs in its own venv (qwen-tts pins transformers 4.57.3); never imports mstar. Called by
``make_fixtures.py`` as ``python qwen_tts_reference.py CHECKPOINT CASES_JSON OUT.safetensors``.

Per case, greedy on both samplers: the prompt token ids, the talker's prefill input
embeddings, the talker's raw logits of every step, the code predictor's raw logits per
residual group per frame, the codes and the decoded audio. Plus one decode of a random code
sequence (the codec alone). A case's ``mode`` picks the entry point: ``custom_voice``
(speaker, optional ``instruct``), ``design`` (``instruct``) or ``clone`` (Base: a synthetic
reference clip at ``ref_sr`` through ``create_voice_clone_prompt``, x_vector_only_mode
without ``ref_text``, in-context mode with it; the clip is saved once per (rate, seconds,
seed) as ``clip/{rate}_{seconds}_{seed}``, with the speaker embedding, the reference codes
and the reference text ids).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file


def _stub_25hz_only_modules() -> None:
    # qwen_tts imports its 25 Hz tokenizer at package import, which needs torchaudio,
    # onnxruntime and sox; the 12 Hz path never calls them. Stubs avoid pulling builds.
    # transformers is imported first so it records them as unavailable.
    import importlib.machinery

    import transformers  # noqa: F401

    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "onnxruntime", "sox"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = stub
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]


class Recorder:
    """Forward hooks collecting the last-position output of modules, call by call."""

    def __init__(self) -> None:
        self.talker_logits: list[torch.Tensor] = []
        self.predictor_logits: list[list[torch.Tensor]] = []  # per frame: G-1 tensors
        self.prefill_embeds: list[torch.Tensor] = []

    def talker_hook(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.talker_logits.append(output[0, -1].detach().clone())

    def predictor_hook(self, group: int):  # noqa: ANN201
        def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
            if group == 0:
                self.predictor_logits.append([])
            self.predictor_logits[-1].append(output[0, -1].detach().clone())

        return hook

    def talker_input_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and embeds.shape[1] > 1:
            self.prefill_embeds.append(embeds[0].detach().clone())


def _check_layout(model: torch.nn.Module, checkpoint: Path) -> None:
    """The checkpoint's keys must be exactly the reference's (the codec encoder's only in Base)."""
    from safetensors import safe_open

    def keys(path: Path) -> set[str]:
        with safe_open(str(path), framework="pt") as f:
            return set(f.keys())

    want = set(model.state_dict()) - {k for k in model.state_dict() if k.startswith("speech_tokenizer")}
    got = keys(checkpoint / "model.safetensors")
    # The codec's encoder ships with (and is checked for) Base checkpoints only.
    parts = ("decoder.", "encoder.") if model.tts_model_type == "base" else ("decoder.",)
    codec_want = {k for k in model.speech_tokenizer.model.state_dict() if k.startswith(parts)}
    codec_got = keys(checkpoint / "speech_tokenizer" / "model.safetensors")
    for what, a, b in (("model.safetensors", got, want), ("speech_tokenizer/model.safetensors", codec_got, codec_want)):
        if a != b:
            raise SystemExit(f"{what}: layout differs from qwen-tts: extra {sorted(a - b)[:8]}, missing {sorted(b - a)[:8]}")


def _reference_clip(seconds: float, rate: int, seed: int) -> np.ndarray:
    """A voiced-ish synthetic clip: two partials with vibrato, plus a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    wave = 0.3 * np.sin(2 * np.pi * (180 * t + 3 * np.sin(2 * np.pi * 5 * t))) + 0.1 * np.sin(2 * np.pi * 1250 * t)
    return (wave + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def _clone(wrapper, case: dict, common: dict, out: dict) -> tuple:  # noqa: ANN001
    """The Base path end to end: create_voice_clone_prompt on the clip (speaker encoder; in
    in-context mode also the speech tokenizer's encoder and the transcript), then generate."""
    name = case["name"]
    clip = _reference_clip(case["ref_seconds"], case["ref_sr"], case["ref_seed"])
    icl = bool(case.get("ref_text"))
    item = wrapper.create_voice_clone_prompt(ref_audio=(clip, case["ref_sr"]), ref_text=case.get("ref_text"),
                                             x_vector_only_mode=not icl)[0]
    out[f"clip/{case['ref_sr']}_{case['ref_seconds']}_{case['ref_seed']}"] = torch.from_numpy(clip)  # shared by cases
    out[f"{name}/speaker_embed"] = item.ref_spk_embedding.detach().float().clone()
    if icl:
        out[f"{name}/ref_codes"] = item.ref_code.to(torch.int64)
        out[f"{name}/ref_ids"] = wrapper._tokenize_texts([wrapper._build_ref_text(case["ref_text"])])[0][0].to(torch.int64)
    return wrapper.generate_voice_clone(voice_clone_prompt=[item], **common)


def main(checkpoint: str, cases_path: str, out_path: str) -> None:
    _stub_25hz_only_modules()
    from qwen_tts import Qwen3TTSModel

    torch.manual_seed(0)
    cases = json.loads(Path(cases_path).read_text())
    wrapper = Qwen3TTSModel.from_pretrained(checkpoint, dtype=torch.float32)
    model = wrapper.model.eval()
    talker = model.talker
    _check_layout(model, Path(checkpoint))
    out: dict[str, torch.Tensor] = {}

    rec = Recorder()
    talker.codec_head.register_forward_hook(rec.talker_hook)
    for g, head in enumerate(talker.code_predictor.lm_head):
        head.register_forward_hook(rec.predictor_hook(g))
    talker.model.register_forward_pre_hook(rec.talker_input_hook, with_kwargs=True)
    codes_seen: list[torch.Tensor] = []
    generate = model.generate

    def recording_generate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        codes, hiddens = generate(*args, **kwargs)
        codes_seen.append(codes[0].detach().clone())
        return codes, hiddens

    model.generate = recording_generate  # type: ignore[method-assign]

    for case in cases:
        name = case["name"]
        rec.__init__()
        codes_seen.clear()
        ids = wrapper._tokenize_texts([wrapper._build_assistant_text(case["text"])])[0]
        common = {"text": case["text"], "language": case["language"], "non_streaming_mode": case["non_streaming_mode"],
                  "do_sample": False, "subtalker_dosample": False, "max_new_tokens": case["max_new_tokens"]}
        mode = case.get("mode", "custom_voice")
        if mode == "custom_voice":
            wavs, sr = wrapper.generate_custom_voice(speaker=case["speaker"], instruct=case.get("instruct"), **common)
        elif mode == "design":
            wavs, sr = wrapper.generate_voice_design(instruct=case["instruct"], **common)
        else:
            wavs, sr = _clone(wrapper, case, common, out)
        if case.get("instruct"):
            out[f"{name}/instruct_ids"] = wrapper._tokenize_texts([wrapper._build_instruct_text(case["instruct"])])[0][0].to(torch.int64)
        out[f"{name}/input_ids"] = ids[0].to(torch.int64)
        out[f"{name}/prefill_embeds"] = rec.prefill_embeds[0]
        out[f"{name}/talker_logits"] = torch.stack(rec.talker_logits)
        out[f"{name}/predictor_logits"] = torch.stack([torch.stack(f) for f in rec.predictor_logits])
        out[f"{name}/codes"] = codes_seen[0].to(torch.int64)
        out[f"{name}/audio"] = torch.from_numpy(wavs[0]).to(torch.float32)
        print(f"{name}: {tuple(ids.shape)} ids, {len(rec.talker_logits)} talker steps, "
              f"{tuple(codes_seen[0].shape)} codes, {wavs[0].shape[0]} samples at {sr} Hz")

    # The codec alone, on a longer random code sequence.
    codec = model.speech_tokenizer.model
    cfg = codec.config.decoder_config
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, cfg.codebook_size, (40, cfg.num_quantizers), generator=gen)
    wav, _ = model.speech_tokenizer.decode([{"audio_codes": codes}])
    out["codec/codes"] = codes.to(torch.int64)
    out["codec/audio"] = torch.from_numpy(wav[0]).to(torch.float32)
    save_file({k: v.contiguous() for k, v in out.items()}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
