"""Where each node's tensors are in a Qwen3-Omni checkpoint, as arguments of core's
``mstar.weights.load_weights`` (``model.safetensors`` or HF's shards, read strictly).

The released checkpoints hold three components, ``thinker.*`` (with its encoder towers
``thinker.audio_tower.*`` and ``thinker.visual.*``, loaded by their own nodes),
``talker.*`` and ``code2wav.*``. A component's load skips the others' keys and reports
any key that is no component's. The MoE layers run from stacked expert tensors that the
checkpoints store one module per expert.
"""

from __future__ import annotations

from typing import Any

from mstar.weights import Packed, Stacked

TOWER_PREFIXES = {"audio": "thinker.audio_tower.", "vision": "thinker.visual."}

EXPERTS: dict[str, Any] = dict(
    stacked=(Stacked("mlp.gate_up", "mlp.experts.{}.gate_up_proj.weight"), Stacked("mlp.down", "mlp.experts.{}.down_proj.weight")),
    packed=(Packed("gate_up_proj", ("gate_proj", "up_proj")),),
)

THINKER_KEYS: dict[str, Any] = dict(prefix="thinker.", skip=(*TOWER_PREFIXES.values(), "talker.", "code2wav."), **EXPERTS)
TALKER_KEYS: dict[str, Any] = dict(prefix="talker.", skip=("thinker.", "code2wav."), **EXPERTS)
CODE2WAV_KEYS: dict[str, Any] = dict(prefix="code2wav.", skip=("thinker.", "talker."))
# The towers check only their own keys: the Thinker's load checks the rest of the file.
AUDIO_TOWER_KEYS: dict[str, Any] = dict(prefix=TOWER_PREFIXES["audio"])
VISION_TOWER_KEYS: dict[str, Any] = dict(prefix=TOWER_PREFIXES["vision"])
