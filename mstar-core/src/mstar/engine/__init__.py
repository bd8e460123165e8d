"""The runtime: requests, walk cursors, scheduler, node executors and ``mstar.Engine``."""
