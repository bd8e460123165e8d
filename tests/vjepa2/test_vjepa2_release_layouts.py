"""V-JEPA 2 from its tiny checkpoint rewritten into the layouts releases use
(``mstar.testing.release_layouts``): the video processor's config in
``video_preprocessor_config.json`` (as written), under the older shared name
``preprocessor_config.json``, nested in ``processor_config.json`` with ``dtype`` configs
(transformers 5's save), or absent; and sharded weights. The written config's mean and std
differ from the defaults, so reading the wrong file shows. In each: the preprocessing is
the one transformers' video processor reads from the directory (its own
``get_video_processor_dict``; the model's crop and the defaults when there is none), the serve
warm-up's own path (``load_adapter``, the warm-up request, ``generate_inputs``, the engine)
succeeds, and its latents equal ``transformers.VJEPA2Model`` on the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mstar import Engine
from mstar.testing.release_layouts import variant_copy
from mstar_vjepa2.video import VideoPreprocessing

transformers = pytest.importorskip("transformers")
LAYOUTS = {
    "written": (),
    "legacy_name": ("video_config_as_preprocessor_config",),
    "transformers5": ("processor_configs_nested", "dtype_key"),
    "no_processor_config": ("without_video_preprocessor_config",),
    "sharded": ("sharded",),
}
TOL = 1e-4


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mstar_vjepa2.checkpoint import write_checkpoint

    root = tmp_path_factory.mktemp("vjepa2-written")
    write_checkpoint(root, seed=7)
    path = root / "video_preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3]}))
    return root


def reference_preprocessing(root: Path, crop: int) -> VideoPreprocessing:
    """The config transformers' video processor reads from ``root``, as our parameters."""
    from transformers.video_processing_utils import BaseVideoProcessor

    try:
        cfg = BaseVideoProcessor.get_video_processor_dict(str(root))[0]
    except OSError:  # none: the processor's defaults, for the model's crop
        return VideoPreprocessing.for_crop(crop)
    c = cfg["crop_size"]["height"]
    return VideoPreprocessing(int(c * 256 / 224), c, tuple(cfg["image_mean"]), tuple(cfg["image_std"]), cfg["rescale_factor"])


@pytest.mark.parametrize("layout", LAYOUTS)
@torch.no_grad()
def test_layout_preprocesses_warms_up_and_encodes_as_transformers(written, tmp_path, layout) -> None:
    from mstar.server.preprocess import load_adapter

    root = variant_copy(written, tmp_path / layout, *LAYOUTS[layout])
    _, adapter = load_adapter("vjepa2", root)  # as `mstar serve` builds it
    assert adapter.preprocessing == reference_preprocessing(root, adapter.crop)
    warm = adapter.generate_inputs(adapter.warmup_request())
    with Engine.from_model("vjepa2", weights=root) as engine:
        out = engine.run_batch([{"inputs": warm.inputs, "kwargs": warm.kwargs}])[0]
    assert out.error is None, out.error
    want = transformers.VJEPA2Model.from_pretrained(str(root)).eval()(warm.inputs["video"][None]).last_hidden_state[0]
    assert (out.signals["latents"][0] - want).abs().max().item() < TOL
