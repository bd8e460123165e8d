"""Keep what a process built at start-up out of Python's cyclic garbage collector.

An engine process holds hundreds of thousands of long-lived objects after it loads a model
(torch, the plugin, the model's modules). Every full collection walks all of them: on the
2-core AMD EPYC host one took 195 ms over 375,000 objects in a text LM engine at batch 32,
about 0.56 ms a decode step amortised, and a 195 ms pause in whatever stream was running.
``gc.freeze()`` moves them to a permanent generation the collector skips (they are still
freed by reference counting); objects made afterwards are collected as before.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_objects(what: str) -> int:
    """Collect once, then freeze every object alive; the number frozen so far."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: %d start-up objects kept out of the cyclic garbage collector", what, frozen)
    return frozen
