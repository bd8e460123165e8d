"""``vjepa2ac`` (alias ``vjepa2-ac``): V-JEPA 2-AC — the ViT-g encoder and the
action-conditioned predictor, from upstream's ``vjepa2-ac-vitg.pt``.

Walks (request kwarg ``task``): ``encode``; ``rollout`` (encode, then the AC predictor on
the paged KV cache, one frame per step, each prediction streamed and fed back); ``plan``
(encode, then MPC: score candidates or run CEM against the goal's latents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mstar import hookimpl
from mstar.graph import EngineKind, GraphSpec, Loop, NodeSpec, Sequential, Signal, Step, Walk
from mstar.model.spec import ModelSpec, NodeSamplers

from mstar_vjepa2.walks import VJEPA2AC_TASKS

MODEL_NAME = "vjepa2ac"
DEFAULT_MAX_FRAMES = 32  # frames a rollout may hold in the cache (context + predicted)
PLAN_OUTPUTS = ("costs", "best_index", "plan_actions", "cem_seed")


def load_config(checkpoint_dir: Path) -> dict[str, Any]:
    import json

    from mstar_vjepa2.checkpoint_ac import infer_config

    cfg = infer_config(checkpoint_dir)
    extra = Path(checkpoint_dir) / "config.json"
    cfg["max_frames"] = int(json.loads(extra.read_text()).get("max_frames", DEFAULT_MAX_FRAMES)) if extra.is_file() else DEFAULT_MAX_FRAMES
    return cfg


def build_graph(config: dict[str, Any]) -> GraphSpec:
    return GraphSpec(
        nodes={
            "encoder": NodeSpec("encoder", EngineKind.STATELESS),
            "ac_predictor": NodeSpec("ac_predictor", EngineKind.KV_CACHE),
            "planner": NodeSpec("planner", EngineKind.STATELESS),
        },
        signals={
            "latents": Signal("latents", to_client=True, persist=True),
            "goal_latents": Signal("goal_latents", persist=True),
            "prediction": Signal("prediction", to_client=True),
            **{name: Signal(name, to_client=True) for name in PLAN_OUTPUTS},
        },
        walks={
            # No declared input: the "*_latents" tasks need no video (the node checks it).
            "encode": Walk("encode", "main", Step("encoder", inputs=(), outputs=("latents", "goal_latents"))),
            "rollout": Walk("rollout", "main", Sequential((
                Step("ac_predictor", inputs=("latents",), outputs=("prediction",)),
                Loop("rollout_loop", Step("ac_predictor", inputs=("prediction",), outputs=("prediction",)), stop_on=("ac_predictor",)),
            ))),
            "plan": Walk("plan", "main", Step("planner", inputs=("latents", "goal_latents"), outputs=PLAN_OUTPUTS)),
        },
        state_machine=VJEPA2AC_TASKS,
    )


def _write_tiny(path: Path) -> None:
    from mstar_vjepa2.checkpoint_ac import write_checkpoint

    write_checkpoint(path)


def _example_requests(config: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    img, a = config["img_size"], config["action_dim"]
    video = torch.randn(2, config["in_chans"], img, img)
    states = torch.rand(2, a)
    return [
        {"inputs": {"video": video}, "kwargs": {"task": "encode"}},
        {"inputs": {"video": video, "actions": 0.1 * torch.randn(4, a), "states": states}, "kwargs": {"task": "rollout"}},
        {"inputs": {"video": video[:1], "goal": video[1:], "states": states[:1], "candidates": torch.randn(3, 2, a)},
         "kwargs": {"task": "plan"}},
    ]


@hookimpl
def mstar_model_spec() -> ModelSpec:
    return ModelSpec(
        name=MODEL_NAME,
        aliases=("vjepa2-ac",),
        load_config=load_config,
        build_graph=build_graph,
        write_tiny_checkpoint=_write_tiny,
        default_placement={"encoder": "0", "ac_predictor": "0", "planner": "0"},
        example_requests=_example_requests,
    )


_PREDICTORS: dict[tuple[str, str, str], Any] = {}


def _predictor(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    """One predictor module per (checkpoint, device, dtype), shared by the rollout and
    planner nodes so the weights are held once (engines of another dtype get their own)."""
    from mstar_vjepa2.ac_predictor import ACPredictor
    from mstar_vjepa2.checkpoint_ac import ac_config, load_predictor

    key = (str(checkpoint_dir), str(device), str(dtype))
    if checkpoint_dir is None or key not in _PREDICTORS:
        pred = ACPredictor(ac_config(config)).to(dtype)
        if checkpoint_dir is not None:
            load_predictor(pred, checkpoint_dir)
        pred = pred.to(device=device, dtype=dtype).eval()
        if checkpoint_dir is None:
            return pred
        _PREDICTORS[key] = pred
    return _PREDICTORS[key]


def _build_encoder(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    from mstar_vjepa2.checkpoint_ac import encoder_config, load_encoder
    from mstar_vjepa2.nodes_ac import ACEncoderNode

    node = ACEncoderNode(encoder_config(config), VJEPA2AC_TASKS, config["max_frames"]).to(dtype)
    if checkpoint_dir is not None:
        load_encoder(node.encoder, checkpoint_dir)
    return node.to(device=device, dtype=dtype).eval()


def _build_ac_predictor(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    from mstar_vjepa2.checkpoint_ac import ac_config
    from mstar_vjepa2.nodes_ac import ACPredictorNode

    node = ACPredictorNode(ac_config(config), config["max_frames"])
    node.predictor = _predictor(config, checkpoint_dir, device, dtype)
    return node.to(device=device, dtype=dtype).eval()


def _build_planner(config: dict[str, Any], checkpoint_dir: Path | None, device: str, dtype: Any = None) -> Any:
    from mstar_vjepa2.checkpoint_ac import ac_config
    from mstar_vjepa2.nodes_ac import PlannerNode

    return PlannerNode(ac_config(config), _predictor(config, checkpoint_dir, device, dtype)).to(device=device, dtype=dtype).eval()


@hookimpl
def mstar_node_factories(config: dict) -> dict[str, Any]:
    return {"encoder": _build_encoder, "ac_predictor": _build_ac_predictor, "planner": _build_planner}


@hookimpl
def mstar_node_samplers(config: dict) -> dict[str, NodeSamplers]:
    return {}  # a world model: nothing is sampled


@hookimpl
def mstar_api_adapter(model_name: str, config: dict, checkpoint_dir: Path | None) -> Any:
    from mstar_vjepa2.adapter import VJEPA2ACAdapter

    return VJEPA2ACAdapter(config, checkpoint_dir)
