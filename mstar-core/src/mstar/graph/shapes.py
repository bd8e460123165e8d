"""The graph shapes models share, built from a few names.

``streaming_lm_graph``: an autoregressive KV node (walk ``prefill`` reads the request's
inputs, walk ``decode`` loops until core's stop rules end it) whose ``stream`` output feeds,
chunk by chunk, a stateless decoder in a partition of its own (walk ``vocode`` loops until
the stream closes) — a speech LM and its codec. A text LLM is ``mstar.text.lm.text_lm_graph``.
"""

from __future__ import annotations

from collections.abc import Mapping

from mstar.graph.chunking import ChunkPolicy
from mstar.graph.spec import (
    EngineKind,
    GraphSpec,
    LinearWalks,
    Loop,
    NodeSpec,
    Signal,
    Step,
    StreamingEdge,
    Walk,
)
from mstar.model.spec import MixedBatchConfig

PREFILL, DECODE, VOCODE, MIXED = "prefill", "decode", "vocode", "mixed"


def streaming_lm_graph(
    *,
    lm: str,
    decoder: str,
    request_inputs: tuple[str, ...],
    step_inputs: tuple[str, ...],
    lm_outputs: tuple[str, ...],
    stream: str,
    chunk_policy: ChunkPolicy,
    chunk_inputs: tuple[str, ...],
    decoder_outputs: tuple[str, ...] = ("audio",),
    signals: Mapping[str, Signal] | None = None,
    decoder_partition: str = "audio",
) -> GraphSpec:
    """``chunk_inputs`` names the decoder's chunk input and, optionally, the context-length
    input (``LeftContextChunks``). ``signals`` declares the LM outputs other than ``stream``
    (client outputs, persisted step inputs); ``stream`` is declared here and, unless given
    in ``signals``, goes to no client. Decoder outputs go to the client."""
    chunk, context = chunk_inputs[0], (chunk_inputs[1] if len(chunk_inputs) > 1 else None)
    declared = dict(signals or {})
    base = declared.pop(stream, Signal(stream))
    edge = StreamingEdge(decoder_partition, chunk, chunk_policy, context)
    declared[stream] = Signal(stream, to_client=base.to_client, persist=base.persist, stream=edge)
    for name in decoder_outputs:
        declared.setdefault(name, Signal(name, to_client=True))
    decode_step = Step(lm, inputs=step_inputs, outputs=lm_outputs)
    return GraphSpec(
        nodes={lm: NodeSpec(lm, EngineKind.KV_CACHE), decoder: NodeSpec(decoder, EngineKind.STATELESS)},
        signals=declared,
        walks={
            PREFILL: Walk(PREFILL, lm, Step(lm, inputs=request_inputs, outputs=lm_outputs)),
            DECODE: Walk(DECODE, lm, Loop("decode_loop", decode_step, stop_on=(lm,))),
            VOCODE: Walk(
                VOCODE,
                decoder_partition,
                Loop("vocode_loop", Step(decoder, inputs=chunk_inputs, outputs=decoder_outputs), until_stream_closed=stream),
            ),
        },
        state_machine=LinearWalks({lm: (PREFILL, DECODE), decoder_partition: (VOCODE,)}),
        request_inputs=request_inputs,
    )


def prefill_decode_mixing(node: str, max_prefill_rows: int | None = 4) -> list[MixedBatchConfig]:
    """Prefill and decode rows of ``node`` in one forward (continuous batching), at most
    ``max_prefill_rows`` prefills per step so decodes keep their pace."""
    caps = {PREFILL: max_prefill_rows} if max_prefill_rows is not None else {}
    return [MixedBatchConfig(node=node, walks=(PREFILL, DECODE), merged_walk=MIXED, max_rows=caps)]
