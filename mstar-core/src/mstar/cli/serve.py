"""``mstar serve``: the OpenAI-compatible server (API process + engine processes)."""

from __future__ import annotations

import json

import click

from mstar.model.precision import DTYPE_NAMES


@click.command("serve")
@click.argument("model_arg", metavar="[MODEL]", required=False)
@click.option("--model", "models", multiple=True, help="Model name, alias, checkpoint directory or Hugging Face repo id (or give it as the argument). Repeat it to serve several models: then each is NAME (with --random-weights), NAME:WEIGHTS (NAME:random for random weights), a checkpoint directory or a repo id.")
@click.option("--models-config", type=click.Path(exists=True, dir_okay=False), default=None, help="YAML listing the models to serve, each with its weights, served names, placement and limits (see docs/serving.md).")
@click.option("--weights", default=None, help="Checkpoint directory or Hugging Face repo id.")
@click.option("--revision", default=None, help="Branch, tag or commit of a Hugging Face repo id.")
@click.option("--served-model-name", "served_model_names", multiple=True, help="Name(s) of the model in the API (repeatable; the first is reported). Default: the plugin's name and aliases.")
@click.option("--random-weights", is_flag=True, help="Serve the plugin's tiny random checkpoint (output is noise).")
@click.option("--config", "placement", type=click.Path(exists=True, dir_okay=False), default=None, help="Placement YAML: nodes per device group.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--api-key", default=None, envvar="MSTAR_API_KEY", help="Require 'Authorization: Bearer KEY' (env MSTAR_API_KEY).")
@click.option("--max-concurrency", default=64, show_default=True, type=click.IntRange(min=1), help="Requests running at once; more wait in a queue.")
@click.option("--max-queue", default=512, show_default=True, type=click.IntRange(min=0), help="Requests waiting beyond --max-concurrency; more get 429.")
@click.option("--request-timeout", default=600.0, show_default=True, type=float, help="Seconds before a request is aborted (0: none).")
@click.option("--realtime-idle-timeout", default=600.0, show_default=True, envvar="MSTAR_REALTIME_IDLE_S", type=click.FloatRange(min=0, min_open=True), help="Seconds a /v1/realtime session may go without a client event while no response runs; then it is closed (env MSTAR_REALTIME_IDLE_S).")
@click.option("--max-body-bytes", default=32 << 20, show_default=True, type=int, help="Larger request bodies get 413.")
@click.option("--preprocess-workers", default=None, type=click.IntRange(min=0), help="Preprocess pool size (0: preprocess inline).")
@click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE", help="An EngineConfig field, e.g. kv_budget_bytes=67108864 (repeatable).")
@click.option("--engine-threads", default=None, type=click.IntRange(min=1), help="torch intra-op threads per engine process (default: torch's); with overlap_nodes its two threads get half each (EngineConfig.cpu_threads).")
@click.option("--shm-threshold", default=None, type=int, hidden=True, help="Tensors of at least this many bytes go through shared memory.")
@click.option("--device", default="cpu", show_default=True, help="Device of the default placement's groups.")
@click.option("--dtype", default=None, type=click.Choice(sorted(DTYPE_NAMES), case_sensitive=False), help="Weights and activations: auto (default: the checkpoint's dtype on accelerators, float32 on CPU), bfloat16, float16 or float32, on any device. Nodes the plugin keeps in float32 (codecs) stay so.")
@click.option("--prefix-caching/--no-prefix-caching", default=None, help="Share cached prompt prefixes between requests on every KV node (EngineConfig.prefix_caching; default on: --no-prefix-caching turns it off).")
@click.option("--restart-engines/--no-restart-engines", default=True, show_default=True, help="Restart a dead engine process (back-off 1 s doubling to 30 s).")
@click.option("--max-engine-restarts", default=5, show_default=True, type=click.IntRange(min=0), help="Restarts per engine within --engine-restart-window; one more death and it stays down.")
@click.option("--engine-restart-window", default=600.0, show_default=True, type=click.FloatRange(min=0), help="Seconds over which --max-engine-restarts counts (0: over the server's whole life).")
@click.option("--max-header-bytes", default=64 << 10, show_default=True, type=click.IntRange(min=1024), help="A request's line and headers; larger: 400 and the connection closed.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Seconds for a request's headers to arrive (and for an idle connection between requests); then it is closed.")
@click.option("--body-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Seconds for a request's whole body to arrive; slower: 408 and the connection closed.")
@click.option("--max-connections", default=1024, show_default=True, type=click.IntRange(min=1), help="Open HTTP connections; a request beyond them gets 503.")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0), help="SIGTERM: seconds running requests may still finish before their streams are ended.")
@click.option("--max-stream-buffer-bytes", default=64 << 20, show_default=True, type=click.IntRange(min=1), help="Output waiting for a client that does not read, per request; beyond it the request is aborted.")
@click.option("--max-stream-buffer-total-bytes", default=256 << 20, show_default=True, type=click.IntRange(min=1), help="Output waiting for clients that do not read, over all requests together; beyond it the request with the most waiting is aborted.")
@click.option("--voices-dir", default=None, envvar="MSTAR_VOICES_DIR", type=click.Path(file_okay=False), help="Where saved voices (POST /v1/audio/voices) are kept (env MSTAR_VOICES_DIR). Default: mstar/voices in the user cache directory.")
@click.option("--voice-max-bytes", default=10 << 20, show_default=True, type=click.IntRange(min=1), help="A saved voice's reference clip: larger files get 413.")
@click.option("--voice-max-seconds", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="A saved voice's reference clip: longer clips get 400.")
@click.option("--placement-backend", default="local", show_default=True, type=click.Choice(["local", "ray"]), help="Run engines as processes of this machine, or as Ray actors on the nodes of a Ray cluster (needs mstar-core[ray]; see docs/ray.md).")
@click.option("--ray-address", default=None, help="With --placement-backend ray: the cluster to join, e.g. auto (the one `ray start` began here) or HOST:PORT; default: RAY_ADDRESS, else the cluster `ray start` began here, else a new local Ray instance.")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
def serve(model_arg: str | None, models: tuple[str, ...], models_config: str | None, weights: str | None, revision: str | None, served_model_names: tuple[str, ...], random_weights: bool, placement: str | None, host: str, port: int, api_key: str | None,
          max_concurrency: int, max_queue: int, request_timeout: float, max_body_bytes: int, preprocess_workers: int | None,
          engine_options: tuple[str, ...], engine_threads: int | None, shm_threshold: int | None, device: str, dtype: str | None,
          restart_engines: bool, max_engine_restarts: int, engine_restart_window: float, max_header_bytes: int, header_timeout: float,
          body_timeout: float, max_connections: int, shutdown_timeout: float, max_stream_buffer_bytes: int, log_level: str,
          max_stream_buffer_total_bytes: int = 256 << 20,
          placement_backend: str = "local", ray_address: str | None = None,
          voices_dir: str | None = None, voice_max_bytes: int = 10 << 20, voice_max_seconds: float = 30.0,
          prefix_caching: bool | None = None, realtime_idle_timeout: float = 600.0) -> None:
    """Serve MODEL over HTTP with an OpenAI-compatible API.

    MODEL is an installed model's name or alias (then give --weights or --random-weights),
    a checkpoint directory, or a Hugging Face repo id (org/name, through the Hub cache);
    for the last two the plugin is picked by config.json's architectures.

    Several models behind one port: repeat --model, or list them in --models-config;
    requests go to the model their "model" field names.
    """
    from mstar.server.config import ServerConfig
    from mstar.server.launcher import ServeConfigError, run_server

    given = list(dict.fromkeys([*([model_arg] if model_arg else []), *models]))
    if models_config and given:
        raise click.UsageError("give the models either as MODEL/--model or in --models-config, not both")
    if not given and not models_config:
        raise click.UsageError("give the model: mstar serve MODEL (a name, checkpoint directory or Hugging Face repo id)")
    several = bool(models_config) or len(given) > 1
    if several:
        for flag, value in (("--weights", weights), ("--served-model-name", served_model_names), ("--config", placement)):
            if value:
                raise click.UsageError(f"{flag} is per model: with several models, give NAME:WEIGHTS to --model or use --models-config")
    config = ServerConfig(
        model=given[0] if given else "", weights=weights, revision=revision, served_model_names=list(served_model_names), random_weights=random_weights, placement=placement, host=host, port=port,
        api_key=api_key, max_concurrency=max_concurrency, max_queue=max_queue, request_timeout_s=request_timeout,
        realtime_idle_s=realtime_idle_timeout,
        max_body_bytes=max_body_bytes, log_level=log_level, device=device, engine_options=_parse_options(engine_options), engine_threads=engine_threads,
        restart_engines=restart_engines, max_engine_restarts=max_engine_restarts, engine_restart_window_s=engine_restart_window,
        max_header_bytes=max_header_bytes, header_timeout_s=header_timeout, body_timeout_s=body_timeout, max_connections=max_connections,
        shutdown_timeout_s=shutdown_timeout,
        max_stream_buffer_bytes=max_stream_buffer_bytes,
        max_stream_buffer_total_bytes=max_stream_buffer_total_bytes,
        voices_dir=voices_dir, voice_max_bytes=voice_max_bytes, voice_max_seconds=voice_max_seconds,
    )
    if dtype is not None:  # --dtype wins over --engine-option dtype=...
        config.engine_options["dtype"] = dtype.lower()
    if prefix_caching is not None:
        config.engine_options["prefix_caching"] = prefix_caching
    if preprocess_workers is not None:
        config.preprocess_workers = preprocess_workers
    if shm_threshold is not None:
        config.shm_threshold = shm_threshold
    config.placement_backend, config.ray_address = placement_backend, ray_address
    try:
        code = run_server(config, _several(config, given, models_config) if several else None)
    except ServeConfigError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from exc
    raise SystemExit(code)


def _several(config: object, given: list[str], models_config: str | None) -> list:
    """One ``ServerConfig`` per model of a several-model command line."""
    from mstar.server.launcher import ServeConfigError
    from mstar.server.model_configs import from_option, load_models_file, model_configs

    try:
        entries = load_models_file(models_config) if models_config else [from_option(v) for v in given]
    except ValueError as exc:
        raise ServeConfigError(str(exc)) from exc
    return model_configs(config, entries)


def _parse_options(items: tuple[str, ...]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--engine-option")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
