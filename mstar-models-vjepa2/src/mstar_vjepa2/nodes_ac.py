"""``vjepa2ac`` nodes: per-frame encoder, the AC predictor on the paged KV cache, the planner.

The predictor node adds whole frames to the cache: the context frames in its first step,
then one predicted frame per step, fed back. Each token travels as one row of
``input_embeds`` ([E + A] wide: a patch latent, or an action / state vector), so the
engine's slicing, preemption replay and positions work unchanged; the token's role follows
from its absolute position (``position % tokens_per_frame``).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any

import torch
from mstar.model.submodule_base import (
    STOP_ALL,
    ARNodeInputs,
    ARNodeSubmodule,
    BatchedModelOutput,
    BatchedStopCheck,
    CurrentForwardPassInfo,
    KVCacheLayout,
    ModelInputsFromEngine,
    NodeInputs,
    NodeSubmodule,
    StopCheck,
)

from mstar_vjepa2.ac_predictor import ACConfig, ACPredictor, frame_causal_mask
from mstar_vjepa2.config import VJEPA2Config
from mstar_vjepa2.nodes import check_video
from mstar_vjepa2.plan import OBJECTIVES, CEMParams, cem, score
from mstar_vjepa2.rollout import next_state, normalize
from mstar_vjepa2.vit import Encoder


class ACEncoderNode(NodeSubmodule):
    """video [T, C, H, W] → normalized latents [T·N, E], each frame encoded alone as a
    2-frame clip (upstream's world-model wrapper); ``goal`` frames → ``goal_latents`` of the
    last goal frame [N, E]. All frames of all rows run as one batch."""

    def __init__(self, cfg: VJEPA2Config, tasks: Any, max_frames: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tasks = tasks
        self.max_frames = max_frames
        self.encoder = Encoder(cfg)

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        self.tasks.check_task(info.request_kwargs)
        if "video" not in signals:
            raise ValueError("video: required (or give latents with task rollout_latents / plan_latents)")
        video = check_video(signals["video"], self.cfg, self.max_frames)
        tensors = {"video": video}
        if "goal" in signals and "goal_latents" not in signals:
            tensors["goal"] = check_video(signals["goal"], self.cfg, self.max_frames, "goal")[-1:]
        return NodeInputs(tensor_inputs=tensors, input_seq_len=video.shape[0])

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        frames, spans = [], []
        for i in inputs:
            spans.append(tuple(i.tensor_inputs[k].shape[0] if k in i.tensor_inputs else 0 for k in ("video", "goal")))
            frames += [i.tensor_inputs["video"]] + ([i.tensor_inputs["goal"]] if "goal" in i.tensor_inputs else [])
        device = self.encoder.layernorm.weight.device
        return {"frames": torch.cat(frames).to(device), "spans": spans}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, frames: torch.Tensor, spans: list[tuple[int, int]]) -> BatchedModelOutput:
        clips = frames.unsqueeze(1).expand(-1, self.cfg.tubelet_size, -1, -1, -1)
        lat = normalize(self.encoder(clips)[0])  # [F, N, E]
        per_rid: dict[str, dict[str, torch.Tensor]] = {}
        at = 0
        for rid, (nv, ng) in zip(engine_inputs.request_ids, spans, strict=True):
            out = {"latents": lat[at : at + nv].flatten(0, 1)}
            if ng:
                out["goal_latents"] = lat[at + nv]
            per_rid[rid] = out
            at += nv + ng
        return BatchedModelOutput(per_rid_outputs=per_rid)


def _actions_states(signals: Mapping[str, torch.Tensor], cfg: ACConfig, context_frames: int, need_actions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's ``actions`` [>= need_actions, A] and ``states`` [>= context_frames, A]."""
    out = []
    for name, need in (("actions", need_actions), ("states", context_frames)):
        if name not in signals:
            raise ValueError(f"{name}: required, a [frames, {cfg.action_dim}] array")
        t = signals[name]
        if t.dim() != 2 or t.shape[1] != cfg.action_dim:
            raise ValueError(f"{name}: expected [frames, {cfg.action_dim}] (action dimension {cfg.action_dim}), got {list(t.shape)}")
        if t.shape[0] < need:
            raise ValueError(f"{name}: {t.shape[0]} rows given, at least {need} needed")
        out.append(t.to(torch.float32))
    return out[0], out[1]


def state_at(states: torch.Tensor, actions: torch.Tensor, t: int) -> torch.Tensor:
    """Frame t's state: given, or integrated from the last given one through the actions."""
    if t < states.shape[0]:
        return states[t]
    s = states[-1]
    for j in range(states.shape[0] - 1, t):
        s = next_state(s, actions[j])
    return s


class ACPredictorNode(ARNodeSubmodule):
    """Rollout walk: step 1 caches the context frames (``latents``, their ``actions`` and
    ``states``) and predicts the next frame; each further step feeds the last prediction
    back with its action. ``actions`` has Tc − 1 + horizon rows: the horizon follows."""

    def __init__(self, cfg: ACConfig, max_frames: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_frames = max_frames
        self.predictor = ACPredictor(cfg)
        if cfg.use_extrinsics:
            raise ValueError("vjepa2ac: checkpoints conditioned on extrinsics are not served")

    def kv_cache_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.cfg.depth, self.cfg.num_heads, self.cfg.head_dim)  # the node's dtype

    def max_model_len(self) -> int:
        return self.max_frames * self.cfg.tokens_per_frame

    def attention_mask(self, graph_walk: str, info: CurrentForwardPassInfo, query_len: int, kv_len: int) -> torch.Tensor:
        tpf = self.cfg.tokens_per_frame
        keys = torch.arange(kv_len) // tpf
        return frame_causal_mask(keys[kv_len - query_len :], keys)

    def _frame_tokens(self, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """[T, N, E] latents + [T, A] actions/states → [T·tpf, E + A] token rows."""
        t, n, e = latents.shape
        a = self.cfg.action_dim
        rows = latents.new_zeros(t, self.cfg.tokens_per_frame, e + a)
        rows[:, 0, e:] = actions
        rows[:, 1, e:] = states
        rows[:, self.cfg.cond_tokens :, :e] = latents
        return rows.flatten(0, 1)

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> ARNodeInputs:
        cfg = self.cfg
        n = cfg.patches
        latents = signals["latents"]
        if latents.dim() != 2 or latents.shape[0] % n or latents.shape[1] != cfg.embed_dim:
            raise ValueError(f"latents: expected [frames·{n}, {cfg.embed_dim}], got {list(latents.shape)}")
        tc = latents.shape[0] // n
        actions, states = _actions_states(signals, cfg, tc, tc)
        horizon = actions.shape[0] - tc + 1
        if tc - 1 + horizon > self.max_frames:
            raise ValueError(f"actions: a rollout of {tc} context + {horizon} predicted frames exceeds {self.max_frames} frames")
        # Which frame this step adds follows from the walk's progress, never from the cache
        # (a preempted request has an empty cache until its frames are replayed).
        if "prediction" not in signals:  # the first step: the context frames
            rows = self._frame_tokens(latents.view(tc, n, -1), actions[:tc], states[:tc])
            done = 1
        else:  # the previous prediction, fed back as frame t
            t = tc + info.iteration
            pred = signals["prediction"].view(1, n, -1)
            rows = self._frame_tokens(pred, actions[t : t + 1], state_at(states, actions, t)[None])
            done = t - tc + 2
        return ARNodeInputs(input_embeds=rows, input_seq_len=rows.shape[0], kwargs={"steps_left": horizon - done})

    def chunk_unit(self) -> int:
        return self.cfg.tokens_per_frame  # a chunk never ends inside a frame

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        weight = self.predictor.predictor_proj.weight
        rows = torch.cat([i.input_embeds for i in inputs])  # type: ignore[attr-defined,misc]
        left = torch.tensor([i.kwargs.get("steps_left", 0) for i in inputs])
        return {"rows": rows.to(device=weight.device, dtype=weight.dtype), "steps_left": left}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, rows: torch.Tensor, steps_left: torch.Tensor) -> BatchedModelOutput:
        cfg, p = self.cfg, self.predictor
        e, tpf = cfg.embed_dim, cfg.tokens_per_frame
        pos = engine_inputs.positions
        indptr = engine_inputs.qo_indptr
        assert pos is not None and indptr is not None and engine_inputs.attention is not None
        ends = pos[indptr[1:] - 1] + 1
        if bool((ends % tpf != 0).any()):
            raise ValueError(f"a step ended inside a frame ({tpf} tokens): chunked prefill cut it; "
                             "raise max_num_batched_tokens or set chunked_prefill=false")
        within = pos % tpf
        x = torch.where((within >= cfg.cond_tokens)[:, None], p.predictor_embed(rows[:, :e]),
                        torch.where((within == 0)[:, None], p.action_encoder(rows[:, e:]), p.state_encoder(rows[:, e:])))
        frame = pos // tpf
        patch = (within - cfg.cond_tokens).clamp(min=0)
        positions = (frame, patch // cfg.grid_w, patch % cfg.grid_w, within < cfg.cond_tokens)
        attn = engine_inputs.attention

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = attn.run(layer, q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1))
            return out.transpose(0, 1)[None]

        h = p.blocks(x[None], positions, attend)[0]
        last = indptr[1:, None] - cfg.patches + torch.arange(cfg.patches, device=h.device)  # each row's last frame
        pred = normalize(p.predictor_proj(p.predictor_norm(h[last])))[:, None]  # [B, 1, N, E]: steps stack on dim 0
        return BatchedModelOutput(row_outputs={"prediction": pred, "steps_left": steps_left.to(pred.device)})

    def check_stop_batched(self, request_ids: list[str], infos: list[CurrentForwardPassInfo], outputs: BatchedModelOutput) -> BatchedStopCheck:
        left = outputs.row_outputs["steps_left"].tolist()
        return BatchedStopCheck({rid: StopCheck(frozenset({STOP_ALL}), reason="stop") for rid, n in zip(request_ids, left, strict=True) if n <= 0})


class PlannerNode(NodeSubmodule):
    """MPC over the AC predictor: ``candidates`` [K, H, A] are scored against
    ``goal_latents``; without candidates, CEM (kwargs ``cem``) searches. Outputs ``costs``
    [K], ``best_index`` and ``plan_actions`` [H, A] (and CEM's ``cem_seed``: without
    ``cem.seed`` a fresh one is drawn). One request's K candidates are one batch."""

    def __init__(self, cfg: ACConfig, predictor: ACPredictor) -> None:
        super().__init__()
        self.cfg = cfg
        self.predictor = predictor

    def can_batch(self, graph_walk: str, infos: list[CurrentForwardPassInfo]) -> bool:
        return False  # a row is already a batch of K candidates

    def prepare_inputs(self, graph_walk: str, info: CurrentForwardPassInfo, signals: Mapping[str, torch.Tensor]) -> NodeInputs:
        cfg = self.cfg
        n = cfg.patches
        latents = signals["latents"]
        tc = latents.shape[0] // n
        actions = signals.get("actions", torch.zeros(0, cfg.action_dim))
        ctx_actions, states = _actions_states({**signals, "actions": actions}, cfg, tc, tc - 1)
        goal = signals["goal_latents"]
        if goal.shape[-2:] != (n, cfg.embed_dim):
            raise ValueError(f"goal_latents: expected [{n}, {cfg.embed_dim}], got {list(goal.shape)}")
        kw = dict(info.request_kwargs)
        objective = str(kw.get("objective", "l1"))
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: {objective!r} is not one of {list(OBJECTIVES)}")
        tensors = {"context": latents.view(tc, n, -1), "context_actions": ctx_actions[: tc - 1], "states": states[:tc],
                   "goal": goal.reshape(-1, n, cfg.embed_dim)[-1]}
        params = None
        if "candidates" in signals:
            cand = signals["candidates"]
            if cand.dim() != 3 or cand.shape[2] != cfg.action_dim or cand.shape[0] < 1:
                raise ValueError(f"candidates: expected [K, horizon, {cfg.action_dim}] (action dimension {cfg.action_dim}), got {list(cand.shape)}")
            tensors["candidates"] = cand.to(torch.float32)
        else:
            try:
                params = CEMParams(**dict(kw.get("cem", {})))
            except TypeError as exc:
                raise ValueError(f"cem: {exc}") from None
            params.validate(cfg.action_dim)
            if params.seed is None:  # fresh randomness, reported so the plan can be reproduced
                params = dataclasses.replace(params, seed=secrets.randbits(63))
        return NodeInputs(tensor_inputs=tensors, kwargs={"objective": objective, "cem_params": params}, input_seq_len=1)

    def chunk_unit(self) -> int:
        return self.cfg.tokens_per_frame  # a chunk never ends inside a frame

    def preprocess(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, inputs: list[NodeInputs]) -> dict[str, Any]:
        weight = self.predictor.predictor_proj.weight
        (row,) = inputs
        return {"tensors": {k: v.to(device=weight.device, dtype=weight.dtype if v.is_floating_point() else v.dtype)
                            for k, v in row.tensor_inputs.items()}, **row.kwargs}

    def forward_batched(self, graph_walk: str, engine_inputs: ModelInputsFromEngine, tensors: dict[str, torch.Tensor],
                        objective: str, cem_params: CEMParams | None) -> BatchedModelOutput:
        args = (self.predictor, tensors["context"], tensors["context_actions"], tensors["states"])
        if cem_params is None:
            cand = tensors["candidates"]
            c = score(*args, cand, tensors["goal"], objective)
            plan = cand[int(torch.argmin(c))]
        else:  # the plan is CEM's final mean; costs are those of its last candidates
            plan, c, cand = cem(*args, tensors["goal"], objective, cem_params)
        out = {"costs": c, "best_index": torch.argmin(c).reshape(1), "plan_actions": plan}
        if cem_params is not None:
            out["cem_seed"] = torch.tensor([cem_params.seed])
        return BatchedModelOutput(per_rid_outputs={engine_inputs.request_ids[0]: out})
