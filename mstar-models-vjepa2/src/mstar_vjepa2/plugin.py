"""``vjepa2``: the V-JEPA 2 video encoder and masked predictor (entry point in ``mstar.models``).

Walks (request kwarg ``task``): ``encode`` (video → latents), ``predict`` (video →
latents → predictions for the target tokens, from the context tokens) and ``anticipate``
(a sliding-window rollout of the masked predictor, streamed per step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, Loop, NodeSpec, Signal, Step, Walk
from mstar.model.spec import ModelSpec, NodeSamplers

from mstar_vjepa2.config import ARCHITECTURE, from_hf_dict, load_config
from mstar_vjepa2.walks import VJEPA2_TASKS

MODEL_NAME = "vjepa2"


def build_graph(config: dict[str, Any]) -> GraphSpec:
    return GraphSpec(
        nodes={"encoder": NodeSpec("encoder", EngineKind.STATELESS), "predictor": NodeSpec("predictor", EngineKind.STATELESS)},
        signals={
            "latents": Signal("latents", to_client=True, persist=True),
            "predictions": Signal("predictions", to_client=True),
            "anticipated": Signal("anticipated", to_client=True),
            "window": Signal("window"),  # the anticipation loop's sliding context
        },
        walks={
            "encode": Walk("encode", "main", Step("encoder", inputs=("video",), outputs=("latents",))),
            "predict": Walk("predict", "main", Step("predictor", inputs=("latents",), outputs=("predictions",))),
            "anticipate": Walk("anticipate", "main", Loop(
                "anticipate_loop", Step("predictor", inputs=("latents",), outputs=("anticipated", "window")), stop_on=("predictor",))),
        },
        state_machine=VJEPA2_TASKS,
        request_inputs=("video",),
    )


def _write_tiny(path: Path) -> None:
    from mstar_vjepa2.checkpoint import write_checkpoint

    write_checkpoint(path)


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    cfg = from_hf_dict(config)
    video = torch.randn(cfg.tubelet_size * 2, cfg.in_chans, cfg.crop_size, cfg.crop_size)
    return [{"inputs": {"video": video}, "kwargs": {"task": task, "anticipate": {"steps": 2}}}
            for task in ("encode", "predict", "anticipate")]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("v-jepa2",),
        architectures=(ARCHITECTURE,),
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={"encoder": "0", "predictor": "0"},
        example_requests=_example_requests,
    )


def _build_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    from mstar_vjepa2.checkpoint import load_component
    from mstar_vjepa2.nodes import EncoderNode

    node = EncoderNode(from_hf_dict(config), VJEPA2_TASKS).to(dtype)  # then loaded tensor by tensor, cast as they come
    if checkpoint_dir is not None:
        load_component(node.encoder, checkpoint_dir, "encoder.")
    return node.to(device=device, dtype=dtype).eval()


def _build_predictor(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    from mstar_vjepa2.checkpoint import load_component
    from mstar_vjepa2.nodes import PredictorNode

    node = PredictorNode(from_hf_dict(config)).to(dtype)
    if checkpoint_dir is not None:
        load_component(node.predictor, checkpoint_dir, "predictor.")
    return node.to(device=device, dtype=dtype).eval()


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"encoder": _build_encoder, "predictor": _build_predictor}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    return {}  # a world model: nothing is sampled


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_vjepa2.adapter import VJEPA2Adapter

    return VJEPA2Adapter(config, checkpoint_dir)
