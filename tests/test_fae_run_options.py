"""`fae run` options: the FaeRunConfig dataclass parsed like training's recipes (defaults < YAML < CLI)."""

import re
from pathlib import Path

import pytest

from real_fae_core.errors import UserError
from real_fae_core.cli import parse_command_line
from fae.ablation.runner import FaeRunConfig, RunRequest, build_config, load_yaml_options
from helpers import parse_run_args
from fae.cli import main



REPO = Path(__file__).resolve().parents[1]
REQUIRED = ["--records", "r.jsonl", "--output", "out", "--model", "m"]

# config.json "settings" keys: a file format, so they must not drift with the dataclass.
SETTINGS_KEYS = ["records", "output", "backend", "model", "adapter", "rounds", "max_new_tokens", "limit",
                 "chunk_size", "constrained_decoding", "label_probs", "batch_size", "device", "dtype", "weights",
                 "trust_remote_code", "base_url",
                 "api_key_env", "concurrency", "request_timeout", "max_retries", "backoff_base", "seed",
                 "routing_header", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
                 "shard", "executor", "shards", "backend_args", "ray_gpus_per_shard", "control", "control_seed",
                 "gold_only", "cited_only", "size_sweep", "sweep_seed", "line_ids"]


def yaml_file(tmp_path, text, name="eval.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("key, flag, yaml_value, cli_value, expected_yaml, expected_cli", [
    ("rounds", ["--rounds"], "2", ["7"], 2, 7),                          # int
    ("limit", ["--limit"], "5", ["9"], 5, 9),                            # optional int
    ("request_timeout", ["--request-timeout"], "5", ["2.5"], 5.0, 2.5),  # float
    ("device", ["--device"], "cpu", ["cuda:1"], "cpu", "cuda:1"),         # string
    ("progress", ["--no-progress"], "true", [], True, False),             # flag that turns a default off
    ("progress", ["--progress"], "false", [], False, True),
    ("constrained_decoding", ["--constrained-decoding"], "false", [], False, True),  # flag that turns one on
    ("label_probs", ["--no-label-probs"], "true", [], True, False),
])
def test_defaults_then_yaml_then_command_line(tmp_path, key, flag, yaml_value, cli_value, expected_yaml,
                                              expected_cli):
    default = getattr(FaeRunConfig(), key)
    assert getattr(parse_run_args(REQUIRED)[0], key) == default
    cfg = yaml_file(tmp_path, f"{key}: {yaml_value}\n")
    assert getattr(parse_run_args(["--config", cfg, *REQUIRED])[0], key) == expected_yaml
    options, config = parse_run_args(["--config", cfg, *REQUIRED, *flag, *cli_value])
    assert getattr(options, key) == expected_cli and config == cfg


def test_a_flag_equal_to_the_default_still_beats_the_yaml(tmp_path):
    cfg = yaml_file(tmp_path, "rounds: 2\n")
    options, _ = parse_run_args(["--config", cfg, *REQUIRED, "--rounds", "4"])
    assert options.rounds == 4


def test_keys_may_be_spelled_like_flags_and_values_take_their_field_types(tmp_path):
    cfg = yaml_file(tmp_path, "max-new-tokens: 12\nrequest_timeout: 5\nseed: '3'\nlimit: null\n")
    assert load_yaml_options(cfg) == {"max_new_tokens": 12, "request_timeout": 5.0, "seed": 3, "limit": None}
    assert isinstance(load_yaml_options(cfg)["request_timeout"], float)


@pytest.mark.parametrize("text, message", [
    ("model: m\nmax_new_token: 8\n", "bad.yaml:2: max_new_token: unknown key (did you mean 'max_new_tokens'?)"),
    ("config: other.yaml\n", "bad.yaml:1: config: unknown key"),
    ("rounds: 1.5\n", "bad.yaml:1: rounds: must be a whole number, got 1.5"),
    ("model: m\nrounds: -1\n", "bad.yaml:2: rounds: must be >= 0, got -1"),
    ("rounds: true\n", "bad.yaml:1: rounds: must be an integer"),
    ("rounds:\n", "bad.yaml:1: rounds: must not be empty (null)"),
    ("no_progress: true\n", "bad.yaml:1: no_progress: unknown key"),
    ("progress: 'off'\n", "bad.yaml:1: progress: must be true or false"),
    ("model: [a, b]\n", "bad.yaml:1: model: must be a string"),
    ("batch-size: 0\n", "bad.yaml:1: batch-size: must be >= 1, got 0"),  # a backend's declared range
    ("request_timeout: 0\n", "bad.yaml:1: request_timeout: must be > 0, got 0.0"),
    ("rounds: 2\nrounds: 3\n", "bad.yaml:2: key 'rounds' is given twice (lines 1 and 2)"),
    ("- rounds\n", "bad.yaml: expected a mapping of option: value"),
])
def test_bad_yaml_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, message):
    cfg = yaml_file(tmp_path, text, "bad.yaml")
    with pytest.raises(UserError) as err:
        parse_run_args(["--config", cfg, *REQUIRED])
    assert "bad.yaml" in str(err.value) and message in str(err.value)
    assert main(["run", "--config", cfg, *REQUIRED]) == 2
    out = capsys.readouterr().err
    assert out.startswith("fae run: error: ") and message in out and len(out.splitlines()) == 1


def test_a_typo_in_a_flag_is_argparse_s_usage_error(capsys):
    assert main(["run", *REQUIRED, "--roundz", "2"]) == 2
    assert "fae run: error: unrecognized arguments: --roundz 2" in capsys.readouterr().err
    assert main(["run", *REQUIRED, "--rounds", "two"]) == 2
    assert "argument --rounds: invalid int value: 'two'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--rounds", "-1", "argument --rounds: must be >= 0, got -1"),
    ("--max-new-tokens", "0", "argument --max-new-tokens: must be >= 1, got 0"),
    ("--chunk-size", "0", "argument --chunk-size: must be >= 1, got 0"),
])
def test_out_of_range_flags_are_usage_errors(capsys, flag, value, message):
    assert main(["run", *REQUIRED, flag, value]) == 2
    assert f"fae run: error: {message}" in capsys.readouterr().err


def test_the_dataclass_checks_its_ranges_itself():
    with pytest.raises(ValueError, match="rounds: must be >= 0"):
        FaeRunConfig(rounds=-1)


def test_missing_required_options_name_the_flags(tmp_path):
    with pytest.raises(UserError, match=r"^missing --output \(on the command line or in --config\)$"):
        parse_run_args(["--config", yaml_file(tmp_path, "model: m\nrecords: r.jsonl\n")])


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes" / "eval").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_eval_recipe_parses_and_flags_override_it(recipe):
    options, config = parse_run_args(["--config", str(recipe), "--records", "r.jsonl", "--output", "o",
                                      "--rounds", "2"])
    assert config == str(recipe) and options.rounds == 2 and options.backend in ("hf", "openai", "vllm")
    assert options.model == load_yaml_options(str(recipe))["model"]


def test_help_lists_every_option(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fae run")
    flags = {"--config", "--no-progress", "--no-label-probs"}
    flags |= {"--" + name.replace("_", "-") for name in SETTINGS_KEYS}
    missing = sorted(f for f in flags if f not in out)
    assert not missing, missing
    assert "(default: 4)" in out  # defaults shown from the dataclass, not a marker


def test_the_recorded_command_is_the_command_line_as_given(tmp_path):
    cfg = yaml_file(tmp_path, "rounds: 2\n")
    _options, context = parse_command_line(FaeRunConfig, ["--model", "m", "--config", cfg, "--records", "r.jsonl",
                                                          "--output", "o d", "--max_new_tokens=8", "--no-progress"],
                                           "fae run")
    assert context["command"] == (f"fae run --model m --config {cfg} --records r.jsonl "
                            "--output 'o d' --max_new_tokens=8 --no-progress")


def test_config_json_stores_the_command_and_every_resolved_option(tmp_path):
    from fae.backends.hf import HFBackend

    records = tmp_path / "r.jsonl"
    records.write_text("{}\n")
    argv = ["--config", yaml_file(tmp_path, "rounds: 2\nbatch-size: 3\n"), "--records", str(records),
            "--output", "o", "--model", "m", "--no-label-probs"]
    options, context = parse_command_line(FaeRunConfig, argv, "fae run")
    request = RunRequest(options, context["command"], context["config_file"])
    cfg = build_config(request, HFBackend, {"greedy": True}, ["a"])
    assert cfg["command"] == "fae run " + " ".join(argv) and cfg["config_file"].endswith("eval.yaml")
    assert sorted(cfg["settings"]) == sorted(SETTINGS_KEYS)
    assert cfg["settings"]["rounds"] == 2 and cfg["settings"]["batch_size"] == 3
    assert cfg["settings"]["label_probs"] is False and cfg["settings"]["concurrency"] == 8  # a default


@pytest.mark.parametrize("argv, yaml_text, message", [
    (["--tensor-parallel-size", "2"], None, "--tensor-parallel-size is an option of --backend vllm; "
                                            "--backend hf does not read it"),
    (["--backend", "openai", "--batch-size", "4"], None, "--batch-size is an option of --backend hf;"),
    (["--backend", "openai", "--dtype=bf16"], None, "--dtype is an option of --backend hf / vllm;"),
    (["--backend", "vllm", "--concurrency", "4"], None, "--concurrency is an option of --backend openai;"),
    (["--backend", "openai"], "batch-size: 32\n", "eval.yaml:1: batch-size is an option of --backend hf;"),
])
def test_an_option_of_another_backend_is_an_error_naming_it(tmp_path, argv, yaml_text, message):
    """It would be ignored silently: the user believes a run used options it never read."""
    from real_fae_core.cli import parse_command_line

    def parse_args(argv):
        return parse_command_line(FaeRunConfig, argv, "fae run")

    extra = ["--config", yaml_file(tmp_path, yaml_text)] if yaml_text else []
    with pytest.raises(UserError, match=re.escape(message)):
        parse_args([*extra, *REQUIRED, *argv])
    ok = {"--backend": "hf", "--batch-size": "4"} if "--batch-size" in argv else {}
    if ok:  # the same option with its own backend is fine
        assert parse_args([*REQUIRED, "--batch-size", "4"])[0].batch_size == 4
