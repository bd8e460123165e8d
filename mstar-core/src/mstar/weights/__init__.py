"""Strict, memory-mapped weight loading: the one path every plugin's weights take.

``load_weights(module, checkpoint, ...)`` fills a module from a safetensors checkpoint
(single file or HF shards) or any ``TensorSource`` (``torch_file`` for ``torch.save``
files, ``WeightNormFolded`` for weight-norm pairs), with a key prefix, other components'
keys skipped, renames, fused/split projections (``Packed``), stacked tensors
(``Stacked``) and tied parameters; one ``CheckpointMismatchError`` lists every problem
before anything is copied, and tensors are cast one at a time as they are copied.
``materialize(module, device)`` replaces ``module.to_empty(device=...)`` after a meta-device
build: on a tensor-parallel rank it keeps only the rank's part (``mstar.weights.sharding``).
"""

from mstar.weights.errors import CheckpointMismatchError
from mstar.weights.loader import check_weights, load_weights
from mstar.weights.plan import Packed, Stacked
from mstar.weights.sharding import materialize
from mstar.weights.sources import (
    INDEX_FILE,
    SINGLE_FILE,
    SafetensorsSource,
    StateDictSource,
    TensorSource,
    torch_file,
)
from mstar.weights.weight_norm import WeightNormFolded

__all__ = [
    "INDEX_FILE",
    "SINGLE_FILE",
    "CheckpointMismatchError",
    "Packed",
    "SafetensorsSource",
    "Stacked",
    "StateDictSource",
    "TensorSource",
    "WeightNormFolded",
    "check_weights",
    "load_weights",
    "materialize",
    "torch_file",
]
