"""``mstar bench``: benchmark a running server (chat or speech), like ``vllm bench serve``."""

from __future__ import annotations

import math

import click


def _percentiles(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        out = tuple(float(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    if not out or any(not 0 <= p <= 100 for p in out):
        raise click.BadParameter("give percentiles between 0 and 100, e.g. 50,90,99")
    return out


@click.command("bench")
@click.option("--base-url", default=None, help="Server URL (default: http://HOST:PORT).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None, help="Model name sent in requests (default: the first of /v1/models).")
@click.option("--api-key", default=None, envvar="MSTAR_API_KEY", help="Bearer key (env MSTAR_API_KEY).")
@click.option("--workload", type=click.Choice(["chat", "speech"]), default="chat", show_default=True, help="POST /v1/chat/completions or /v1/audio/speech.")
@click.option("--dataset-name", type=click.Choice(["random", "jsonl"]), default="random", show_default=True)
@click.option("--dataset-path", type=click.Path(exists=True, dir_okay=False), default=None, help="JSONL file: one {\"prompt\": ...} (or \"input\", \"messages\") per line.")
@click.option("--num-prompts", default=100, show_default=True, type=click.IntRange(min=1), help="Requests to measure (a JSONL file is cycled or cut).")
@click.option("--random-input-len", default=32, show_default=True, type=click.IntRange(min=1), help="Words per random prompt.")
@click.option("--random-output-len", "max_tokens", default=None, type=click.IntRange(min=1), help="max_tokens of every request (default: 128 for random prompts, the server's for JSONL).")
@click.option("--ignore-eos", is_flag=True, help="Generate exactly max_tokens tokens (M* extension).")
@click.option("--temperature", default=None, type=float, help="Sampling temperature (default: the model's).")
@click.option("--voice", default=None, help="Speech voice.")
@click.option("--request-rate", default=math.inf, show_default=True, type=float, help="Requests per second (inf: send all at once).")
@click.option("--burstiness", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Gamma shape of the arrival gaps (1: Poisson).")
@click.option("--max-concurrency", default=None, type=click.IntRange(min=1), help="Requests in flight at most.")
@click.option("--num-warmups", default=0, show_default=True, type=click.IntRange(min=0), help="Requests sent (all at once) before measuring.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Chat: stream (TTFT, ITL) or whole responses.")
@click.option("--speech-stream-format", type=click.Choice(["audio", "sse"]), default="audio", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of random prompts and arrival times.")
@click.option("--metric-percentiles", default="50,90,99", show_default=True, callback=_percentiles)
@click.option("--result-file", type=click.Path(dir_okay=False, writable=True), default=None, help="Write the summary as JSON here.")
@click.option("--save-detailed", is_flag=True, help="Also write every request's timings to --result-file.")
@click.option("--timeout", default=600.0, show_default=True, type=float, help="Seconds per request.")
@click.option("--disable-tqdm", is_flag=True, help="No progress bar.")
def bench(base_url: str | None, host: str, port: int, model: str | None, api_key: str | None, workload: str,
          dataset_name: str, dataset_path: str | None, num_prompts: int, random_input_len: int, max_tokens: int | None,
          ignore_eos: bool, temperature: float | None, voice: str | None, request_rate: float, burstiness: float,
          max_concurrency: int | None, num_warmups: int, stream: bool, speech_stream_format: str, seed: int,
          metric_percentiles: tuple[float, ...], result_file: str | None, save_detailed: bool, timeout: float,
          disable_tqdm: bool) -> None:
    """Benchmark a running server: throughput and latency percentiles."""
    import httpx

    from mstar.bench import (
        RunOptions,
        format_summary,
        jsonl_requests,
        random_requests,
        run,
        summarize,
        write_result,
    )

    if request_rate <= 0:
        raise click.BadParameter("must be positive (inf: all at once)", param_hint="--request-rate")
    fields = {"ignore_eos": True if ignore_eos else None, "temperature": temperature, "voice": voice}
    if dataset_name == "jsonl":
        if dataset_path is None:
            raise click.UsageError("--dataset-name jsonl needs --dataset-path FILE")
        try:
            requests = jsonl_requests(workload, dataset_path, num_prompts, max_tokens, **fields)  # type: ignore[arg-type]
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    else:
        requests = random_requests(workload, num_prompts, random_input_len, max_tokens or 128, seed, **fields)  # type: ignore[arg-type]
    url = base_url or f"http://{host}:{port}"
    options = RunOptions(
        url, model=model, api_key=api_key, max_concurrency=max_concurrency, request_rate=request_rate,
        burstiness=burstiness, seed=seed, warmups=num_warmups, stream=stream, speech_format=speech_stream_format,
        timeout_s=timeout, progress=not disable_tqdm,
    )
    click.echo(f"benchmarking {url}: {len(requests)} {workload} requests, rate {request_rate} req/s, "
               f"max concurrency {max_concurrency or 'unlimited'}, {num_warmups} warm-up")
    try:
        result = run(requests, options)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    summary = summarize(result, metric_percentiles)
    click.echo(format_summary(summary))
    errors = sorted({r.error for r in result.records if r.error})
    for error in errors[:5]:
        click.echo(f"error: {error}", err=True)
    if result_file:
        config = {"base_url": url, "model": options.model, "workload": workload, "dataset_name": dataset_name,
                  "dataset_path": dataset_path, "num_prompts": num_prompts, "request_rate": request_rate,
                  "burstiness": burstiness, "max_concurrency": max_concurrency, "num_warmups": num_warmups,
                  "stream": stream, "seed": seed, "percentiles": list(metric_percentiles)}
        write_result(result_file, summary, result, config, save_detailed)
        click.echo(f"result written to {result_file}")
    if summary["completed"] == 0:  # nothing was measured: a script must not read this as a result
        raise click.ClickException(f"none of the {summary['requests']} requests completed")
