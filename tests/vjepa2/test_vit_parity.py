"""Encoder and masked predictor vs ``transformers``' VJEPA2Model on a tiny random checkpoint
in the HF layout; clips of different lengths run as one padded batch on our side."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mstar_vjepa2.checkpoint import load_component, write_checkpoint  # noqa: E402
from mstar_vjepa2.config import from_hf_dict, load_config  # noqa: E402
from mstar_vjepa2.vit import VJEPA2  # noqa: E402

TOL = 1e-4
FRAMES = (4, 8, 6)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("vjepa2")
    write_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def ours(ckpt):
    cfg = from_hf_dict(load_config(ckpt))
    model = VJEPA2(cfg).eval()
    load_component(model, ckpt)
    return cfg, model


@pytest.fixture(scope="module")
def ref(ckpt):
    return transformers.VJEPA2Model.from_pretrained(str(ckpt)).eval()


def _clips(cfg):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(t, 3, cfg.crop_size, cfg.crop_size, generator=gen) for t in FRAMES]


def _padded(clips):
    t = max(c.shape[0] for c in clips)
    out = torch.zeros(len(clips), t, *clips[0].shape[1:])
    for i, c in enumerate(clips):
        out[i, : c.shape[0]] = c
    return out, torch.tensor([c.shape[0] for c in clips])


def _pad_ids(ids):
    n = max(len(i) for i in ids)
    out = torch.zeros(len(ids), n, dtype=torch.long)
    for b, i in enumerate(ids):
        out[b, : len(i)] = i
    return out, torch.tensor([len(i) for i in ids])


@torch.no_grad()
def test_encoder_matches_transformers_for_a_ragged_batch(ours, ref):
    cfg, model = ours
    clips = _clips(cfg)
    latents, lengths = model.encoder(*_padded(clips))
    for b, clip in enumerate(clips):
        want = ref(clip[None], skip_predictor=True).last_hidden_state[0]
        assert int(lengths[b]) == want.shape[0]
        got = latents[b, : want.shape[0]]
        assert (got - want).abs().max().item() < TOL


@torch.no_grad()
@pytest.mark.parametrize("masks", ["default", "explicit"])
def test_predictor_matches_transformers(ours, ref, masks):
    cfg, model = ours
    clips = _clips(cfg)
    latents, lengths = model.encoder(*_padded(clips))
    gen = torch.Generator().manual_seed(2)
    ctx, tgt = [], []
    for n in lengths.tolist():
        if masks == "default":
            ctx.append(torch.arange(n))
            tgt.append(torch.arange(n))
        else:  # a random split: context first half of a permutation, targets the rest
            perm = torch.randperm(n, generator=gen)
            k = n // 3
            ctx.append(perm[k:].sort().values)
            tgt.append(perm[:k].sort().values)
    ci, cl = _pad_ids(ctx)
    ti, tl = _pad_ids(tgt)
    pred = model.predictor(latents, ci, cl, ti, tl)
    for b, clip in enumerate(clips):
        kw = {} if masks == "default" else {"context_mask": [ctx[b][None]], "target_mask": [tgt[b][None]]}
        want = ref(clip[None], **kw).predictor_output.last_hidden_state[0]
        got = pred[b, : want.shape[0]]
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < TOL, (got - want).abs().max().item()
