"""transformers' Qwen3-Omni Thinker on the same checkpoint files, and multimodal test cases
whose encoder outputs come from transformers' own encoders (so the Thinker LLM is checked
independently of M*'s encoders)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

IM_START, IM_END, NL, USER, ASSISTANT = 151644, 151645, 198, 872, 77091
# mstar.testing.release_layouts transforms giving the layout Qwen/Qwen3-Omni-30B-A3B-Instruct ships.
RELEASE = ("template_in_chat_template_json", "slow_tokenizer_files", "generation_config_without_eos", "torch_dtype_key", "sharded")
VISION_START, VISION_END, IMAGE, VIDEO = 151652, 151653, 151655, 151656
AUDIO_START, AUDIO_END, AUDIO = 151669, 151670, 151675


@functools.cache
def hf_thinker(ckpt: str) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).thinker.eval()


@dataclass
class Case:
    name: str
    prompt: list[int]
    engine_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # besides prompt_ids
    hf_inputs: dict[str, Any] = field(default_factory=dict)


def _chat(body: list[int]) -> list[int]:
    return [IM_START, USER, NL, *body, IM_END, NL, IM_START, ASSISTANT, NL]


def _text(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(260, 600, (n,), generator=g).tolist()


def _vision(model: Any, grids: list[list[int]], seed: int, video: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    cfg = model.config.vision_config
    grid = torch.tensor(grids)
    dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = (model.get_video_features if video else model.get_image_features)(pixels, grid, return_dict=True)
    kind = "video" if video else "image"
    return pixels, {
        f"{kind}_grid_thw": grid,
        f"{kind}_embeds": torch.cat(out.pooler_output),
        f"{kind}_deepstack": torch.stack([torch.cat(f) for f in out.deepstack_features]),
    }


def _audio(model: Any, frames: int, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    mels = model.config.audio_config.num_mel_bins
    feats = torch.randn(1, mels, frames, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(1, frames, dtype=torch.long)
    with torch.no_grad():
        embeds = model.get_audio_features(feats, mask, return_dict=True).last_hidden_state
    hf = {"input_features": feats, "feature_attention_mask": mask}
    return hf, {"audio_feature_lengths": torch.tensor([frames]), "audio_embeds": embeds}


def audio_tokens(frames: int, n_window: int = 50) -> int:
    """transformers' audio token count for ``frames`` mel frames (its formula, restated)."""
    rest = frames % (2 * n_window)
    first = (rest - 1) // 2 + 1
    return ((first - 1) // 2 + 1 - 1) // 2 + 1 + (frames // (2 * n_window)) * 13


def make_cases(ckpt: Path) -> dict[str, Case]:
    model = hf_thinker(str(ckpt))
    merge = model.config.vision_config.spatial_merge_size
    cases = {"text": Case("text", _chat(_text(1, 14)))}

    pixels, eng = _vision(model, [[1, 4, 4]], 2, video=False)
    n = 16 // merge**2
    cases["image"] = Case("image", _chat([VISION_START, *[IMAGE] * n, VISION_END, *_text(3, 5)]), eng,
                          {"pixel_values": pixels, "image_grid_thw": eng["image_grid_thw"]})

    pixels, eng = _vision(model, [[1, 4, 4], [1, 8, 4]], 4, video=False)
    body = [VISION_START, *[IMAGE] * 4, VISION_END, *_text(5, 3), VISION_START, *[IMAGE] * 8, VISION_END, *_text(6, 4)]
    cases["two_images"] = Case("two_images", _chat(body), eng, {"pixel_values": pixels, "image_grid_thw": eng["image_grid_thw"]})

    frames = 130  # one full 100-frame chunk and a partial one
    hf_audio, eng = _audio(model, frames, 7)
    body = [*_text(8, 3), AUDIO_START, *[AUDIO] * audio_tokens(frames), AUDIO_END, *_text(9, 2)]
    cases["audio"] = Case("audio", _chat(body), eng, hf_audio)

    pixels, eng = _vision(model, [[3, 4, 4]], 10, video=True)
    eng["video_second_per_grid"] = torch.tensor([0.5])  # 6.5 position steps per grid: fractional times
    body = [VISION_START, *[VIDEO] * (3 * 16 // merge**2), VISION_END, *_text(11, 4)]
    cases["video"] = Case("video", _chat(body), eng, {"pixel_values_videos": pixels, "video_grid_thw": eng["video_grid_thw"],
                                                       "video_second_per_grid": eng["video_second_per_grid"]})

    pixels, eng = _vision(model, [[2, 4, 4]], 12, video=True)
    eng["video_second_per_grid"] = torch.tensor([2.0])
    frames = 60
    hf_audio, eng_audio = _audio(model, frames, 13)
    eng.update(eng_audio)
    cases["video_with_audio"] = Case(
        "video_with_audio",
        _chat([VISION_START, AUDIO_START, *_interleave(2, 16 // merge**2, 2.0 * 13, audio_tokens(frames)), AUDIO_END, VISION_END,
               *_text(14, 3)]),
        eng,
        {"pixel_values_videos": pixels, "video_grid_thw": eng["video_grid_thw"], "video_second_per_grid": eng["video_second_per_grid"],
         **hf_audio, "use_audio_in_video": True},
    )
    return cases


def _interleave(frames: int, per_frame: int, step: float, audio: int) -> list[int]:
    """Video and audio tokens in time order, video first on ties (one audio token per position)."""
    items = [(f * step, 0, VIDEO) for f in range(frames) for _ in range(per_frame)] + [(float(a), 1, AUDIO) for a in range(audio)]
    return [tok for _, _, tok in sorted(items, key=lambda x: (x[0], x[1]))]


def hf_logits(ckpt: Path, case: Case, generated: list[int]) -> torch.Tensor:
    """[len(generated), V]: logits of the prefill's last position and each decode step, from
    one full forward over prompt + generated tokens."""
    model = hf_thinker(str(ckpt))
    ids = torch.tensor([case.prompt + generated[:-1]])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), **case.hf_inputs)
    return out.logits[0, len(case.prompt) - 1 :].float()


def hf_greedy(ckpt: Path, case: Case, n: int) -> list[int]:
    model = hf_thinker(str(ckpt))
    ids = torch.tensor([case.prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, eos_token_id=None,
                             do_sample=False, **case.hf_inputs)
    return out[0, len(case.prompt):].tolist()


def reference_prompt(root: Path, messages: list[dict[str, Any]]) -> list[int]:
    """The chat prompt transformers makes on ``root``: the processor's template (the
    tokenizer's when the processor's files hold none), applied by its tokenizer."""
    from transformers import AutoTokenizer, ProcessorMixin

    tok = AutoTokenizer.from_pretrained(str(root))
    template = ProcessorMixin.get_processor_dict(str(root))[0].get("chat_template") or tok.chat_template
    return tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, return_dict=True)["input_ids"]


def end_answer_at(ckpt: Path, prompt: list[int], step: int, end_id: int = IM_END) -> None:
    """Rewrite ``ckpt``'s Thinker head so that its greedy answer to ``prompt`` is the answer it
    gave before up to ``step``, then ``end_id``: ``end_id``'s row becomes the least-norm row
    whose logit is one below the winner's at the steps before ``step`` and one above it at
    ``step``. Call it before anything loads the checkpoint (``hf_thinker`` caches by path)."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3OmniMoeForConditionalGeneration

    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).thinker.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = thinker.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=step + 1,
                               eos_token_id=None, do_sample=False, return_dict_in_generate=True)
        seq = out.sequences[0]
        assert end_id not in seq[len(prompt):].tolist()
        hidden = thinker.model(input_ids=seq[None, :-1], attention_mask=torch.ones(1, len(seq) - 1, dtype=torch.long)).last_hidden_state
    h = hidden[0, len(prompt) - 1 :].double()  # [step + 1, H]: the states that predict each answer token
    winners = (h @ thinker.lm_head.weight.double().T).max(-1).values
    target = winners + torch.tensor([-1.0] * step + [1.0], dtype=torch.float64)
    row = torch.linalg.lstsq(h, target[:, None]).solution[:, 0]  # least-norm: H has full row rank
    del thinker
    path = ckpt / "model.safetensors"
    state = load_file(str(path))
    state["thinker.lm_head.weight"][end_id] = row.float()
    path.unlink()  # a new file: the old one may be mapped
    save_file(state, str(path), metadata={"format": "pt"})
