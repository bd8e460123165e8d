"""Several models per server without processes: ``--model`` values and ``--models-config``
files become one ``ServerConfig`` each; ``ModelSet`` routes names, refuses clashes, and
sums the models' health."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from mstar.api.errors import ApiError
from mstar.cli.serve import serve
from mstar.server.config import ServerConfig
from mstar.server.metrics import MODEL_SCOPE_KEY, MetricFamilies, ServerMetrics
from mstar.server.model_configs import (
    ModelEntry,
    from_option,
    load_models_file,
    model_configs,
    with_sampling_defaults,
)
from mstar.server.model_set import ModelSet


def test_model_option_forms() -> None:
    assert from_option("toy") == ModelEntry(model="toy")
    assert from_option("toy:/ckpt/toy") == ModelEntry(model="toy", weights="/ckpt/toy")
    assert from_option("orpheus:org/repo") == ModelEntry(model="orpheus", weights="org/repo")
    assert from_option("qwen3tts:random") == ModelEntry(model="qwen3tts", random_weights=True)
    # A path or repo id alone stays whole, colons and all.
    assert from_option("/ckpt/a:b") == ModelEntry(model="/ckpt/a:b")
    assert from_option("org/name") == ModelEntry(model="org/name")


def test_models_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  - model: toy\n    random_weights: true\n    served_model_names: chat\n    placement: toy.yaml\n    max_concurrency: 2\n"
        "  - model: orpheus\n    weights: /ckpt/orpheus\n    engine_options: {block_size: 32}\n    sampling: {temperature: 0.5}\n"
    )
    toy, orpheus = load_models_file(path)
    assert toy.served_model_names == ["chat"] and toy.placement == str(tmp_path / "toy.yaml")
    base = ServerConfig(model="", port=9000, max_concurrency=64, engine_options={"kv_budget_bytes": 1 << 20})
    c_toy, c_orpheus = model_configs(base, [toy, orpheus])
    assert (c_toy.model, c_toy.random_weights, c_toy.max_concurrency, c_toy.port) == ("toy", True, 2, 9000)
    assert (c_orpheus.weights, c_orpheus.max_concurrency) == ("/ckpt/orpheus", 64)
    assert c_orpheus.engine_options == {"kv_budget_bytes": 1 << 20, "block_size": 32}
    assert c_orpheus.sampling_defaults == {"temperature": 0.5} and c_toy.sampling_defaults == {}
    assert base.engine_options == {"kv_budget_bytes": 1 << 20}  # not shared with the copies


@pytest.mark.parametrize(("text", "needle"), [
    ("models:\n  - model: toy\n    wieghts: x\n", "models.0.wieghts"),
    ("models: []\n", "models"),
    ("models:\n  - weights: x\n", "models.0.model"),
    ("models:\n  - model: toy\n    max_concurrency: 0\n", "models.0.max_concurrency"),
])
def test_models_file_errors_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        load_models_file(path)


def test_random_weights_applies_to_model_names_only() -> None:
    base = ServerConfig(model="", random_weights=True)
    named, with_weights, checkpoint = model_configs(base, [from_option("toy"), from_option("orpheus:/ckpt/o"), from_option("/ckpt/q")])
    assert named.random_weights and not with_weights.random_weights and not checkpoint.random_weights


@pytest.mark.parametrize("args", [
    ["--model", "toy", "--model", "orpheus", "--weights", "/x"],
    ["--model", "toy", "--model", "orpheus", "--served-model-name", "a"],
    ["toy", "--models-config", __file__],
])
def test_per_model_flags_are_refused_with_several_models(args: list[str]) -> None:
    result = CliRunner().invoke(serve, args)
    assert result.exit_code == 2 and ("per model" in result.output or "not both" in result.output), result.output


def fake_runtime(name: str, aliases: tuple[str, ...], families: MetricFamilies, healthy: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        model_name=name, spec=SimpleNamespace(name=name), config=ServerConfig(model=name),
        metrics=ServerMetrics(name, families), served_names=lambda: {name, *aliases},
        healthy=healthy, draining=False, started=True, retry_after_s=lambda: 3,
        health=lambda: {"status": "ok" if healthy else "unhealthy", "model": name},
    )


def test_model_set_routes_by_name_and_lists_the_names() -> None:
    families = MetricFamilies()
    a, b = fake_runtime("a", ("a1",), families), fake_runtime("b", (), families)
    models = ModelSet([a, b])
    scope: dict = {}
    assert models.get("a1", scope) is a and scope[MODEL_SCOPE_KEY] == "a"
    assert models.get("b") is b
    with pytest.raises(ApiError) as err:
        models.get("c")
    assert err.value.status == 404 and "'a' (also 'a1'), 'b'" in err.value.message


def test_model_set_refuses_a_name_two_models_answer_to() -> None:
    families = MetricFamilies()
    with pytest.raises(ValueError, match="two models answer to 'x'"):
        ModelSet([fake_runtime("a", ("x",), families), fake_runtime("b", ("x",), families)])
    with pytest.raises(ValueError, match="MetricFamilies"):
        ModelSet([fake_runtime("a", (), families), fake_runtime("b", (), MetricFamilies())])


def test_health_of_several_models() -> None:
    families = MetricFamilies()
    up, down = fake_runtime("a", (), families), fake_runtime("b", (), families, healthy=False)
    assert ModelSet([up, fake_runtime("c", (), families)]).health()[:2] == (200, {"status": "ok", "models": {"a": up.health(), "c": {"status": "ok", "model": "c"}}})
    models = ModelSet([up, down])
    status, body, _ = models.health()
    assert status == 503 and body["status"] == "degraded" and body["models"]["b"]["status"] == "unhealthy"
    assert models.health("a")[:2] == (200, up.health())  # one model's probe
    assert models.health("b")[0] == 503


def test_metrics_of_two_models_share_one_registry() -> None:
    families = MetricFamilies()
    ServerMetrics("a", families).running.set(2)
    ServerMetrics("b", families).finished.labels("stop").inc()
    families.count_request("", "/health", 200)
    text = families.render().decode()
    assert 'mstar_running_requests{model="a"} 2.0' in text and 'mstar_running_requests{model="b"} 0.0' in text
    assert 'mstar_request_finish_total{model="b",reason="stop"} 1.0' in text
    assert 'mstar_requests_total{endpoint="/health",model="",status="200"} 1.0' in text


def test_sampling_defaults_of_a_models_file_entry() -> None:
    from mstar.model.spec import NodeSamplers
    from mstar.sampling.params import SamplingParams
    from mstar.sampling.resolve import resolve_node

    decls = {"lm": NodeSamplers(vocab_size=10, main=SamplingParams(), aux={"res": SamplingParams(top_k=5)})}
    out = with_sampling_defaults(decls, None, {"temperature": 0.0, "max_tokens": 7, "aux": {"res": {"temperature": 0.5}}})
    cfg, _ = resolve_node(out["lm"], None)
    assert (cfg.main.temperature, cfg.main.max_tokens, cfg.aux["res"].temperature, cfg.aux["res"].top_k) == (0.0, 7, 0.5, 5)
    cfg, _ = resolve_node(out["lm"], {"main": {"temperature": 0.9}, "aux": {}})
    assert (cfg.main.temperature, cfg.main.max_tokens) == (0.9, 7)  # the request's own value wins
    assert decls["lm"].main.temperature == 1.0  # the plugin's declaration is untouched
    with pytest.raises(ValueError, match=r"sampling\.top_p"):
        with_sampling_defaults(decls, "lm", {"top_p": 2})
    with pytest.raises(ValueError, match=r"sampling\.tempreature"):
        with_sampling_defaults(decls, "lm", {"tempreature": 0})
    with pytest.raises(ValueError, match=r"unknown label\(s\) \['nope'\]"):
        with_sampling_defaults(decls, "lm", {"aux": {"nope": {}}})


def test_the_example_models_file_is_valid() -> None:
    path = Path(__file__).resolve().parents[3] / "examples" / "several_models.yaml"
    configs = model_configs(ServerConfig(model=""), load_models_file(path))
    assert [(c.model, c.random_weights, c.served_model_names) for c in configs] == [
        ("toy", True, ["chat", "toy"]), ("orpheus", True, []), ("qwen3tts", True, [])]
    assert configs[0].sampling_defaults == {"temperature": 0.7, "max_tokens": 64} and configs[1].max_concurrency == 16


def test_dtype_of_a_models_file_entry_and_of_the_command_line(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - model: toy\n    dtype: bf16\n  - model: orpheus\n")
    base = ServerConfig(model="", engine_options={"dtype": "float32"})
    toy, orpheus = model_configs(base, load_models_file(path))
    assert toy.engine_options["dtype"] == "bfloat16" and orpheus.engine_options["dtype"] == "float32"
    path.write_text("models:\n  - model: toy\n    dtype: bf32\n")
    with pytest.raises(ValueError, match=r"models\.0\.dtype.*unknown dtype 'bf32'"):
        load_models_file(path)
    import mstar.server.launcher as launcher

    seen: list[ServerConfig] = []
    monkeypatch.setattr(launcher, "run_server", lambda config, several=None: seen.append(config) or 0)
    result = CliRunner().invoke(serve, ["toy", "--random-weights", "--dtype", "BF16", "--engine-option", "dtype=float16"])
    assert result.exit_code == 0, result.output
    assert seen[0].engine_options["dtype"] == "bf16"  # --dtype wins; core reads bf16 as bfloat16
