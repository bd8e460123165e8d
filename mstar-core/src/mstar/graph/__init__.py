"""Walk graphs: the nodes of a model, the walks over them and the signals between them."""

from mstar.graph.chunking import ChunkPolicy, FixedChunks, LeftContextChunks, SlidingWindowChunks
from mstar.graph.spec import (
    EngineKind,
    GraphError,
    GraphSpec,
    LinearWalks,
    Loop,
    NodeSpec,
    Parallel,
    Sequential,
    Signal,
    Step,
    StreamingEdge,
    Walk,
    WalkStateMachine,
)

__all__ = [
    "ChunkPolicy",
    "EngineKind",
    "FixedChunks",
    "GraphError",
    "GraphSpec",
    "LeftContextChunks",
    "LinearWalks",
    "Loop",
    "NodeSpec",
    "Parallel",
    "Sequential",
    "Signal",
    "SlidingWindowChunks",
    "Step",
    "StreamingEdge",
    "Walk",
    "WalkStateMachine",
]
