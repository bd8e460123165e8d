"""``mstar bench``: a load generator and latency report for any running M* server (or any
server with the same OpenAI-compatible chat and speech endpoints).

Library use, e.g. from a benchmark script::

    from mstar.bench import RunOptions, random_requests, run, summarize

    reqs = random_requests("chat", num=64, input_words=32, max_tokens=64, ignore_eos=True)
    result = summarize(run(reqs, RunOptions("http://127.0.0.1:8000", max_concurrency=8)))
    print(result["output_throughput"], result["p99_ttft_ms"])
"""

from mstar.bench.local_server import LocalServer
from mstar.bench.records import BenchRequest, BenchRun, RequestRecord
from mstar.bench.report import format_summary, write_result
from mstar.bench.runner import RunOptions, arrival_gaps, arun, run
from mstar.bench.stats import DEFAULT_PERCENTILES, describe, percentile, summarize, tpot
from mstar.bench.workload import jsonl_requests, random_requests

__all__ = [
    "DEFAULT_PERCENTILES",
    "BenchRequest",
    "BenchRun",
    "LocalServer",
    "RequestRecord",
    "RunOptions",
    "arrival_gaps",
    "arun",
    "describe",
    "format_summary",
    "jsonl_requests",
    "percentile",
    "random_requests",
    "run",
    "summarize",
    "tpot",
    "write_result",
]
