"""``vjepa2`` through the real engine: encode and encode+predict walks, clips of different
lengths and different masks in one batch, against ``transformers``' VJEPA2Model."""

from __future__ import annotations

import pytest
import torch
from mstar import Engine
from mstar.testing.conformance import assert_conformant
from mstar_vjepa2.checkpoint import write_checkpoint
from mstar_vjepa2.config import TINY_CONFIG

transformers = pytest.importorskip("transformers")
TOL = 1e-4
CROP = TINY_CONFIG["crop_size"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("vjepa2_engine")
    write_checkpoint(path, seed=5)
    return path


@pytest.fixture(scope="module")
def engine(ckpt):
    with Engine.from_model("vjepa2", weights=ckpt) as eng:
        yield eng


@pytest.fixture(scope="module")
def ref(ckpt):
    return transformers.VJEPA2Model.from_pretrained(str(ckpt)).eval()


def _clip(frames: int, seed: int) -> torch.Tensor:
    return torch.randn(frames, 3, CROP, CROP, generator=torch.Generator().manual_seed(seed))


def test_plugin_conformance():
    assert_conformant("vjepa2")


@torch.no_grad()
def test_encode_and_predict_walks_batch_ragged_requests(engine, ref):
    clips = [_clip(f, i) for i, f in enumerate((2, 8, 4, 6))]
    n = [f // 2 * 16 for f in (2, 8, 4, 6)]
    target = [None, torch.tensor([0, 5, 17, 40]), None, torch.tensor([3, 4])]
    context = [None, torch.tensor([1, 2, 3, 60, 61]), None, torch.tensor([0, 9, 10, 11, 47])]
    reqs = []
    for i, clip in enumerate(clips):
        inputs = {"video": clip}
        if target[i] is not None:
            inputs |= {"target_mask": target[i], "context_mask": context[i]}
        reqs.append({"inputs": inputs, "kwargs": {"task": "encode" if i == 2 else "predict"}})
    outs = engine.run_batch(reqs)
    for i, (clip, out) in enumerate(zip(clips, outs, strict=True)):
        assert out.error is None, out.error
        kw = {} if target[i] is None else {"context_mask": [context[i][None]], "target_mask": [target[i][None]]}
        want = ref(clip[None], **kw)
        latents = out.signals["latents"][0]
        assert latents.shape[0] == n[i]
        assert (latents - want.last_hidden_state[0]).abs().max().item() < TOL
        if i == 2:
            assert "predictions" not in out.signals
            continue
        pred = out.signals["predictions"][0]
        assert (pred - want.predictor_output.last_hidden_state[0]).abs().max().item() < TOL


@pytest.mark.parametrize(("inputs", "kwargs", "needle"), [
    ({"video": torch.randn(9, 3, CROP, CROP)}, {}, "9 frames"),
    ({"video": torch.randn(2, 3, CROP + 1, CROP)}, {}, "video: frames must be"),
    ({"video": torch.randn(2, 3, CROP, CROP), "target_mask": torch.tensor([99])}, {"task": "predict"}, "target_mask"),
    ({"video": torch.randn(2, 3, CROP, CROP)}, {"task": "dance"}, "task"),
])
def test_bad_inputs_fail_alone_naming_the_field(engine, inputs, kwargs, needle):
    good, bad = engine.run_batch([{"inputs": {"video": _clip(2, 9)}}, {"inputs": inputs, "kwargs": kwargs}])
    assert good.error is None and "latents" in good.signals
    assert bad.error is not None and needle in bad.error and bad.error_type == "invalid_request"


@torch.no_grad()
def test_anticipation_rollout_equals_a_transformers_sliding_window(engine, ref):
    clips = [_clip(4, 21), _clip(6, 22)]
    settings = [{"steps": 3}, {"steps": 2, "output_frames": 4, "skip_frames": 2}]
    outs = engine.run_batch([{"inputs": {"video": c}, "kwargs": {"task": "anticipate", "anticipate": a}}
                             for c, a in zip(clips, settings, strict=True)])
    for clip, a, out in zip(clips, settings, outs, strict=True):
        assert out.error is None, out.error
        x = ref(clip[None], skip_predictor=True).last_hidden_state
        n = x.shape[1]
        n_pred = a.get("output_frames", 2) // 2 * 16
        tgt = n + a.get("skip_frames", 0) // 2 * 16 + torch.arange(n_pred)
        steps = out.signals["anticipated"]
        assert len(steps) == a["steps"]
        for got in steps:
            want = ref.predictor(x, [torch.arange(n)[None]], [tgt[None]]).last_hidden_state
            assert (got - want[0]).abs().max().item() < TOL
            x = torch.cat([x[:, n_pred:], want], dim=1)
