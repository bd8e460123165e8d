"""Helpers for engine tests: prompts and a dense (cache-free) greedy reference."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from mstar.model.submodule_base import ModelInputsFromEngine
from mstar_toy.config import encode_text, load_config
from mstar_toy.lm import ToyLM


def prompts(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(1, 40, (1,), generator=g))
        text = "".join(chr(97 + int(c)) for c in torch.randint(0, 26, (length,), generator=g))
        out.append(torch.tensor(encode_text(f"{i}:{text}", 256)))
    return out


GREEDY = {"main": {"temperature": 0, "max_tokens": 12}, "aux": {"residual": {"temperature": 0}}}


class DenseCausalAttention:
    """Reference attention over one contiguous sequence, no cache: plain causal SDPA."""

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        return out.transpose(0, 1)


def load_lm(ckpt: Path) -> ToyLM:
    from mstar.weights import load_weights

    lm = ToyLM(load_config(ckpt))
    load_weights(lm, ckpt, prefix="lm.")
    return lm.eval()


def dense_logits(lm: ToyLM, ids: list[int]) -> torch.Tensor:
    """The LM's next-token logits [V] after ``ids``, from the whole sequence, no cache."""
    with torch.inference_mode():
        ei = ModelInputsFromEngine([], {}, attention=DenseCausalAttention(), positions=torch.arange(len(ids)))
        return lm.logits(lm.hidden_states(torch.tensor(ids), ei)[-1])


def dense_greedy(ckpt: Path, prompt: torch.Tensor, max_tokens: int) -> tuple[list[int], list[int]]:
    """Greedy tokens and residual codes by recomputing the whole sequence every step."""
    cfg = load_config(ckpt)
    lm = load_lm(ckpt)
    ids = prompt.tolist()
    tokens, residuals = [], []
    with torch.inference_mode():
        for _ in range(max_tokens):
            x = torch.tensor(ids)
            ei = ModelInputsFromEngine([], {}, attention=DenseCausalAttention(), positions=torch.arange(len(ids)))
            h = lm.norm(lm.hidden_states(x, ei)[-1:])
            tok = int(lm.head(h).argmax(-1))
            if tok == cfg["eos_token_id"]:
                break
            res = int(lm.aux_head(h + lm.aux_embed(torch.tensor([tok]))).argmax(-1))
            tokens.append(tok)
            residuals.append(res)
            ids.append(tok)
    return tokens, residuals
