"""The stop rules core applies to every sampling node (DESIGN §4, §6).

After a step that drew a main token, a row stops with reason ``"stop"`` when the token is
one of the request's ``stop_token_ids`` or, unless ``ignore_eos``, one of the model's
declared end ids (``NodeSamplers.stop_token_ids``); it stops with ``"length"`` when it has
drawn ``max_tokens`` tokens. ``min_tokens`` needs no rule here: the sampler never draws a
stop id before it. A stop ends the row's partition (``STOP_ALL``). On a stop id the step's
outputs named by ``NodeSamplers.withhold_on_stop`` (default: all of them) are not routed,
so an end-of-sequence token never reaches the client. A plugin only adds model-specific
stops through ``check_stop`` / ``check_stop_batched``; ``merge`` combines the two.
"""

from __future__ import annotations

from collections.abc import Sequence

from mstar.model.spec import NodeSamplers
from mstar.model.submodule_base import STOP_ALL, CurrentForwardPassInfo, StopCheck

_END = frozenset({STOP_ALL})


def core_stop_checks(
    infos: Sequence[CurrentForwardPassInfo],
    tokens: Sequence[int],
    decl: NodeSamplers,
    step_outputs: Sequence[tuple[str, ...]],
) -> list[StopCheck | None]:
    """One answer per row: ``tokens[i]`` is the main token row i drew (-1: none) and
    ``step_outputs[i]`` the outputs of the step it ran."""
    model_ends = frozenset(decl.stop_token_ids)
    out: list[StopCheck | None] = []
    for info, token, outputs in zip(infos, tokens, step_outputs, strict=True):
        params = info.sampling
        withheld = outputs if decl.withhold_on_stop is None else decl.withhold_on_stop
        if token < 0 or params is None:
            out.append(None)
        elif token in params.stop_token_ids or (not params.ignore_eos and token in model_ends):
            out.append(StopCheck(_END, withheld, "stop"))
        elif info.num_generated + 1 >= params.max_tokens:
            out.append(StopCheck(_END, (), "length"))
        else:
            out.append(None)
    return out


def merge(core: StopCheck | None, plugin: StopCheck) -> StopCheck:
    """Core's rule and the plugin's own check: every stop and withheld output of both; core's
    reason wins (it is what the request's parameters said)."""
    if core is None:
        return plugin
    withheld = core.withheld + tuple(o for o in plugin.withheld if o not in core.withheld)
    return StopCheck(core.stops | plugin.stops, withheld, core.reason or plugin.reason)
