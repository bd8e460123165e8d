"""Model ``qwen3tts-voicedesign``: the ``qwen3tts`` hooks unchanged (a checkpoint's ``tts_model_type``
decides the graph and the prompts) with a tiny random VoiceDesign checkpoint, so
``mstar check-plugin qwen3tts-voicedesign`` and ``--random-weights`` exercise that kind. Real
checkpoints of every kind are served by ``qwen3tts`` itself."""

from __future__ import annotations

from dataclasses import replace

from mstar import hookimpl
from mstar.model.spec import ModelSpec, lazy

from mstar_qwen3tts import plugin
from mstar_qwen3tts.plugin import (  # noqa: F401 - the shared hook implementations, registered with this module
    mstar_api_adapter,
    mstar_mixed_batch_configs,
    mstar_node_factories,
    mstar_node_samplers,
    mstar_piecewise_graph_configs,
)


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return replace(plugin.mstar_model_spec(), write_tiny_checkpoint=lazy("mstar_qwen3tts.tiny_checkpoint:write_voice_design_checkpoint"))
