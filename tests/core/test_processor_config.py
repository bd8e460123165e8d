"""``mstar.processor_config``: each preprocessing config found in the file transformers 5.25
reads it from (its own ``get_*_dict`` on the same directory), in the layouts releases use:
one ``preprocessor_config.json`` for an image processor and a feature extractor, a
``video_preprocessor_config.json`` or a video config under the older shared name, and
everything nested in ``processor_config.json`` (what transformers 5 saves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mstar.processor_config import processor_config
from mstar.testing.release_layouts import variant_copy

transformers = pytest.importorskip("transformers")

SHARED = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 32,
          "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 4}
VIDEO = {"video_processor_type": "VJEPA2VideoProcessor", "crop_size": {"height": 16, "width": 16}}


def reference(root: Path, section: str) -> dict | None:
    from transformers.feature_extraction_utils import FeatureExtractionMixin
    from transformers.image_processing_base import ImageProcessingMixin
    from transformers.video_processing_utils import BaseVideoProcessor

    get = {"image_processor": ImageProcessingMixin.get_image_processor_dict,
           "video_processor": BaseVideoProcessor.get_video_processor_dict,
           "feature_extractor": FeatureExtractionMixin.get_feature_extractor_dict}[section]
    try:
        return get(str(root))[0]
    except OSError:  # transformers finds none
        return None


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("written")
    (root / "preprocessor_config.json").write_text(json.dumps(SHARED))
    (root / "video_preprocessor_config.json").write_text(json.dumps(VIDEO))
    return root


LAYOUTS = {
    "own_files": (),
    "nested": ("processor_configs_nested",),
    "video_as_preprocessor_config": ("video_config_as_preprocessor_config",),
    "no_video_config": ("without_video_preprocessor_config",),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("section", ["image_processor", "video_processor", "feature_extractor"])
def test_each_section_is_the_dict_transformers_reads(written, tmp_path, layout, section) -> None:
    root = variant_copy(written, tmp_path / layout, *LAYOUTS[layout])
    want = reference(root, section)
    assert want is not None
    assert processor_config(root, section) == want


def test_the_nested_file_wins_and_none_is_none(written, tmp_path) -> None:
    root = variant_copy(written, tmp_path / "both", "processor_configs_nested")
    (root / "video_preprocessor_config.json").write_text(json.dumps({**VIDEO, "crop_size": 99}))
    assert processor_config(root, "video_processor") == reference(root, "video_processor") == VIDEO
    empty = tmp_path / "empty"
    empty.mkdir()
    assert processor_config(empty, "image_processor") is None is reference(empty, "image_processor")
