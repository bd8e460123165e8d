"""Tensor parallelism: a node's layers split over the ranks of a group (``group``), applied to
the shared layers after loading (``shard``), the ranks' engines kept in lockstep
(``mstar.engine.lockstep``)."""
