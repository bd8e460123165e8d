"""``mstar serve`` for both models on loopback, driven with httpx and ``mstar.client``:
encode / predict from an mp4 the test writes with PyAV, a 4-step rollout (streamed and
whole) equal to a recompute reference, MPC over K = 8 candidates, and the 400s."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import torch
from mstar.api.tensors import tensor_from_json, tensor_to_json
from mstar.client import Client
from mstar_vjepa2.ac_predictor import ACPredictor
from mstar_vjepa2.checkpoint import load_component, write_checkpoint
from mstar_vjepa2.checkpoint_ac import ac_config, infer_config, load_predictor
from mstar_vjepa2.config import from_hf_dict, load_config
from mstar_vjepa2.plan import costs
from mstar_vjepa2.rollout import rollout_recompute
from mstar_vjepa2.video import VideoPreprocessing, decode_video, preprocess
from mstar_vjepa2.vit import VJEPA2
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).parent / "fixtures"
AC_CKPT = FIXTURES / "ac_tiny"
TOL = 1e-4


def _server_process_class():
    spec = importlib.util.spec_from_file_location("e2e_server_process", Path(__file__).parents[1] / "e2e" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.ServerProcess


def _serve(model: str, weights: Path, log: Path):
    srv = _server_process_class()([ "--model", model, "--weights", str(weights), "--preprocess-workers", "1"], log)
    srv.start()
    return srv


@pytest.fixture(scope="module")
def v_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("vjepa2_srv")
    write_checkpoint(path, seed=11)
    return path


@pytest.fixture(scope="module")
def v_server(v_ckpt, tmp_path_factory):
    srv = _serve("vjepa2", v_ckpt, tmp_path_factory.mktemp("log") / "vjepa2.log")
    yield srv
    try:
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill_all()


@pytest.fixture(scope="module")
def ac_server(tmp_path_factory):
    srv = _serve("vjepa2-ac", AC_CKPT, tmp_path_factory.mktemp("log") / "vjepa2ac.log")
    yield srv
    try:
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.kill_all()


def _mp4(frames: int, size: int = 20) -> bytes:
    buf = io.BytesIO()
    yy, xx = np.mgrid[0:size, 0:size]
    with av.open(buf, "w", format="mp4") as box:
        s = box.add_stream("libx264", rate=8)
        s.width = s.height = size
        s.pix_fmt = "yuv420p"
        for i in range(frames):
            img = np.stack([(xx * 9 + i * 30) % 256, (yy * 7) % 256, (xx + yy + i * 11) % 256], -1).astype(np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                box.mux(p)
        for p in s.encode():
            box.mux(p)
    return buf.getvalue()


def _file(data: bytes) -> dict:
    return {"dtype": "uint8", "shape": [len(data)], "data": base64.b64encode(data).decode()}


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@torch.no_grad()
def test_encode_and_predict_from_an_mp4(v_server, v_ckpt):
    cfg = from_hf_dict(load_config(v_ckpt))
    model = VJEPA2(cfg).eval()
    load_component(model, v_ckpt)
    data = _mp4(4)
    pixels = preprocess(decode_video(data, 64), VideoPreprocessing.for_crop(cfg.crop_size))
    want_lat, _ = model.encoder(pixels[None])
    target = torch.tensor([1, 7, 30])
    context = torch.tensor([0, 2, 3, 4, 5, 20, 21])
    want_pred = model.predictor(want_lat, context[None], torch.tensor([7]), target[None], torch.tensor([3]))
    with Client(v_server.url) as c:
        enc = c.generate({"video": _file(data)}, kwargs={"task": "encode"})
        assert set(enc.outputs) == {"latents"}
        assert (enc.outputs["latents"] - want_lat[0]).abs().max().item() < TOL
        out = c.generate({"video": _file(data), "context_mask": context, "target_mask": target}, kwargs={"task": "predict"})
    assert out.outputs["predictions"].shape == (3, cfg.encoder.hidden_size)
    assert (out.outputs["predictions"] - want_pred[0]).abs().max().item() < TOL


@pytest.mark.parametrize(("inputs", "kwargs", "param"), [
    ({"video": _file(b"definitely not an mp4")}, {}, "inputs.video"),
    ({"video": _file(_mp4(10))}, {}, "inputs.video"),  # the tiny model takes at most 8 frames
    ({"video": _file(_mp4(2)), "target_mask": [0, 999]}, {"task": "predict"}, "inputs.target_mask"),
    ({"video": _file(_mp4(2))}, {"task": "dream"}, "kwargs.task"),
])
def test_bad_requests_are_400_naming_the_field(v_server, inputs, kwargs, param):
    r = httpx.post(f"{v_server.url}/v1/generate", json={"model": "vjepa2", "inputs": inputs, "kwargs": kwargs}, timeout=60)
    assert _error(r)["param"] == param


def test_a_multipart_file_upload_equals_the_base64_body(v_server):
    data = _mp4(4)
    request = json.dumps({"model": "vjepa2", "kwargs": {"task": "encode"}})
    r = httpx.post(f"{v_server.url}/v1/generate/upload", data={"request": request},
                   files={"video": ("clip.mp4", data, "video/mp4")}, timeout=60)
    assert r.status_code == 200, r.text
    with Client(v_server.url) as c:
        want = c.generate({"video": _file(data)}, kwargs={"task": "encode"}).outputs["latents"]
    got = tensor_from_json(r.json()["outputs"]["latents"], "latents")
    assert torch.equal(got, want)
    bad = httpx.post(f"{v_server.url}/v1/generate/upload", files={"request": (None, request), "video": (None, "not a file")},
                     timeout=60)
    assert _error(bad)["param"] == "video"


@torch.no_grad()
def test_a_list_of_images_and_raw_frames_encode_like_their_pixels(v_server, v_ckpt):
    from PIL import Image

    cfg = from_hf_dict(load_config(v_ckpt))
    model = VJEPA2(cfg).eval()
    load_component(model, v_ckpt)
    frames = torch.randint(0, 256, (2, 30, 22, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    pngs = []
    for f in frames:
        buf = io.BytesIO()
        Image.fromarray(f.numpy()).save(buf, format="PNG")
        pngs.append(base64.b64encode(buf.getvalue()).decode())
    want, _ = model.encoder(preprocess(frames, VideoPreprocessing.for_crop(cfg.crop_size))[None])
    with Client(v_server.url) as c:
        from_images = c.generate({"video": pngs}, kwargs={"task": "encode"}).outputs["latents"]
        from_frames = c.generate({"video": frames}, kwargs={"task": "encode"}).outputs["latents"]
    assert (from_images - want[0]).abs().max().item() < TOL
    assert torch.equal(from_images, from_frames)


def test_sampling_frames_lets_a_long_video_in(v_server):
    with Client(v_server.url) as c:
        out = c.generate({"video": _file(_mp4(10))}, kwargs={"task": "encode", "num_frames": 4})
    assert out.outputs["latents"].shape[0] == 2 * 16


@pytest.fixture(scope="module")
def ac_ref():
    ref = load_file(str(FIXTURES / "ac_reference.safetensors"))
    model = ACPredictor(ac_config(infer_config(AC_CKPT))).eval()
    load_predictor(model, AC_CKPT)
    return ref, model


def test_four_step_rollout_streamed_and_whole(ac_server, ac_ref):
    ref, model = ac_ref
    ctx = ref["rollout_context"][0][:1]  # one context frame
    gen = torch.Generator().manual_seed(6)
    actions, states = 0.2 * torch.randn(4, 7, generator=gen), torch.rand(1, 7, generator=gen)
    want = rollout_recompute(model, ctx[None], actions[None], states[None], 4)[0]
    inputs = {"latents": ctx.flatten(0, 1), "actions": actions, "states": states}
    with Client(ac_server.url) as c:
        whole = c.generate(inputs, kwargs={"task": "rollout_latents"})
        steps = [t for s, t in c.generate_stream(inputs, kwargs={"task": "rollout_latents"}) if s == "prediction"]
    assert whole.outputs["prediction"].shape == want.shape
    assert (whole.outputs["prediction"] - want).abs().max().item() < TOL
    assert len(steps) == 4
    assert torch.equal(torch.cat(steps), whole.outputs["prediction"])


def test_mpc_with_eight_candidates(ac_server, ac_ref):
    ref, model = ac_ref
    gen = torch.Generator().manual_seed(8)
    frames = ref["frames"]  # preprocessed pixel values: encode here, over HTTP
    cand = 0.3 * torch.randn(8, 2, 7, generator=gen)
    states = torch.rand(1, 7, generator=gen)
    with Client(ac_server.url) as c:
        out = c.generate({"video": frames[:1], "goal": frames[2:], "states": states, "candidates": cand},
                         kwargs={"task": "plan", "objective": "l2"})
        enc = c.generate({"video": frames}, kwargs={"task": "encode"})
    n = 16
    lat = enc.outputs["latents"].view(3, n, -1)
    final = rollout_recompute(model, lat[:1].expand(8, -1, -1, -1), cand, states.expand(8, -1, -1), 2)[:, -1]
    want = costs(final, lat[2], "l2")
    assert out.outputs["costs"].shape == (8,)
    assert (out.outputs["costs"] - want).abs().max().item() < 1e-4
    assert int(out.outputs["best_index"][0]) == int(want.argmin())


@pytest.mark.parametrize(("inputs", "param"), [
    ({"actions": torch.zeros(3, 5)}, "inputs.actions"),
    ({"actions": [[0.0] * 7] * 3, "states": [[0.0] * 6]}, "inputs.states"),
    ({"video": _file(b"\x00\x01garbage")}, "inputs.video"),
])
def test_bad_ac_requests_are_400(ac_server, inputs, param):
    body = {"video": tensor_to_json(torch.zeros(1, 3, 16, 16)), "actions": tensor_to_json(torch.zeros(3, 7)),
            "states": tensor_to_json(torch.zeros(1, 7))}
    body.update({k: tensor_to_json(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
    r = httpx.post(f"{ac_server.url}/v1/generate", json={"model": "vjepa2-ac", "inputs": body, "kwargs": {"task": "rollout"}}, timeout=60)
    assert _error(r)["param"] == param


@pytest.mark.parametrize("model", ["vjepa2", "vjepa2-ac"])
def test_check_plugin_cli_passes(model):
    r = subprocess.run([sys.executable, "-m", "mstar.cli", "check-plugin", model], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 15 checks passed" in r.stdout or "checks passed" in r.stdout
