"""`fae run`'s command line is built by the one generator (real_fae_core.command.add_config_arguments): one
spelling per option, each backend's options under their heading, every bool a `--x` / `--no-x` pair that
undoes the YAML file, and the one old spelling the docs and tests used kept with a warning. Fast: no model."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing

import pytest

from real_fae_core.command import CommandConfig, add_config_arguments, command_line, option
from real_fae_core.cli import command_parser, parse_command_line
from fae.ablation.runner import FaeRunConfig
from helpers import parse_run_args


def make_parser():
    """`fae run`'s parser as the dispatcher generates it."""
    return command_parser("fae run", FaeRunConfig)



REQUIRED = ["--records", "r.jsonl", "--output", "out", "--model", "m"]
BOOLS = [f.name for f in dataclasses.fields(FaeRunConfig)
         if typing.get_type_hints(FaeRunConfig)[f.name] is bool]


def _sections(help_text: str) -> dict[str, str]:
    """{heading: its lines} of a --help text."""
    out, heading = {}, "usage"
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
        out[heading] = out.get(heading, "") + line + "\n"
    return out


def test_help_lists_each_option_once_spelled_with_dashes():
    text = make_parser().format_help()
    assert not re.findall(r"--[a-z]+_[a-z_]+", text), "an underscore spelling is listed"
    for f in dataclasses.fields(FaeRunConfig):
        flag = "--" + f.name.replace("_", "-")
        assert len(re.findall(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", _sections(text)["usage"])) == 1, flag


def test_help_shows_each_backend_under_its_heading():
    sections = _sections(make_parser().format_help())
    assert {"options", "hf backend", "vllm backend (and --dtype)", "openai backend"} <= set(sections)
    assert "--batch-size" in sections["hf backend"] and "--trust-remote-code" in sections["hf backend"]
    assert "--tensor-parallel-size" in sections["vllm backend (and --dtype)"]
    assert "--base-url" in sections["openai backend"] and "--routing-header" in sections["openai backend"]
    assert "--records" in sections["options"] and "--config YAML" in sections["options"]
    assert "(default: 4)" in sections["options"]


@pytest.mark.parametrize("name", BOOLS)
def test_every_bool_is_a_pair_and_the_flag_undoes_the_yaml(tmp_path, name):
    flag = "--" + name.replace("_", "-")
    default = getattr(FaeRunConfig(), name)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"{name}: {str(not default).lower()}\n")
    assert getattr(parse_run_args(["--config", str(cfg), *REQUIRED])[0], name) is (not default)
    undo = flag if default else "--no-" + flag[2:]
    assert getattr(parse_run_args(["--config", str(cfg), *REQUIRED, undo])[0], name) is default
    assert getattr(parse_run_args([*REQUIRED, "--no-" + flag[2:]])[0], name) is False
    assert getattr(parse_run_args([*REQUIRED, flag])[0], name) is True


def test_a_bool_takes_no_value(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_run_args([*REQUIRED, "--progress", "false"])
    assert exc.value.code == 2 and "unrecognized arguments: false" in capsys.readouterr().err


def test_the_documented_underscore_spelling_warns_and_the_others_are_gone(tmp_path, capsys):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("max_new_tokens: 12\nrounds: 2\n")
    for config in ([], ["--config", str(cfg)]):  # once, though a YAML file has the line parsed twice
        options = parse_run_args([*REQUIRED, "--max_new_tokens=8", *config])[0]
        assert (options.max_new_tokens, options.rounds) == (8, 2 if config else 4)
        assert capsys.readouterr().err.splitlines() == [
            "fae run: warning: --max_new_tokens is deprecated; use --max-new-tokens (accepted until 0.2)"]
    for old in ("--control_seed", "--batch_size", "--no_progress"):
        with pytest.raises(SystemExit):
            parse_run_args([*REQUIRED, old, *([] if old.startswith("--no_") else ["3"])])
        assert f"unrecognized arguments: {old}" in capsys.readouterr().err


def test_the_recorded_line_of_a_config_parses_back():
    opts = FaeRunConfig(records="r", output="o", model="m", progress=False, gold_only=False,
                           constrained_decoding=True, max_new_tokens=8, batch_size=3)
    line = command_line("fae run", opts)
    assert "--no-progress" in line and "--no-gold-only" in line and "--constrained-decoding" in line
    assert parse_run_args(line.split()[2:])[0] == opts


# ---------------------------------------------------------------- the generator's group and BOOL_ACTION


@dataclasses.dataclass
class _Grouped(CommandConfig):
    BOOL_ACTION = argparse.BooleanOptionalAction

    name: str = option("a", help="own")
    fast: bool = option(False, help="a bool of the config")
    device: str = option("auto", group="hf backend", help="hf: device")
    url: str | None = option(None, group="openai backend", help="openai: url")
    trust: bool = option(False, group="hf backend", help="hf: trust")


def test_fields_of_one_group_share_one_heading_and_bool_action_applies_to_every_bool():
    parser = argparse.ArgumentParser(prog="p", allow_abbrev=False)
    add_config_arguments(parser, _Grouped)
    sections = _sections(parser.format_help())
    assert "--device" in sections["hf backend"] and "--trust, --no-trust" in sections["hf backend"]
    assert "--url" in sections["openai backend"] and "--fast, --no-fast" in sections["options"]
    assert list(sections).index("hf backend") < list(sections).index("openai backend")
    args = parser.parse_args(["--no-trust", "--fast", "--url", "u"])
    assert _Grouped.from_namespace(args) == _Grouped(fast=True, url="u")
    assert command_line("p", _Grouped(fast=True, trust=False, url="u")) == "p --fast --url u"


def test_a_group_passed_in_keeps_its_fields():
    parser = argparse.ArgumentParser(prog="p", allow_abbrev=False)
    add_config_arguments(parser.add_argument_group("mine"), _Grouped, ["device", "url"])
    sections = _sections(parser.format_help())
    assert "--device" in sections["mine"] and "--url" in sections["mine"] and "hf backend" not in sections


# ---------------------------------------------------------------- the commands that embed backend options


@pytest.mark.parametrize("prog, argv, headings", [
    ("fae pave", ["--records", "r", "--output", "o", "--model", "m"],
     ["hf backend", "vllm backend (and --dtype)", "openai backend"]),
    ("fae study", ["--pools", "p", "--output", "o", "--model", "m"],
     ["hf backend", "vllm backend (and --dtype)", "openai backend"]),
    ("fae probe", ["r", "--output", "o", "--model", "m"], ["hf backend"]),
    ("fae neurons", ["--records", "r", "--output", "o", "--model", "m"], ["hf backend"]),
])
def test_an_embedded_backend_option_is_the_generators_with_its_heading(prog, argv, headings):
    """The backends' options a command embeds come from the one generator (no second one): the same flags
    and bool semantics as before (--trust-remote-code / --no-trust-remote-code), each backend's under its
    heading."""
    from real_fae_core.command import config_type
    from command_walk import command_parsers

    module, cls, parser = command_parsers()[prog]
    sections = _sections(parser.format_help())
    assert set(headings) <= set(sections), prog
    assert "--trust-remote-code, --no-trust-remote-code" in sections["hf backend"]
    assert "--device" in sections["hf backend"] and "--dtype" in sections["hf backend"]
    cls = cls or config_type(module)
    assert cls.from_namespace(parser.parse_args([*argv, "--trust-remote-code"])).trust_remote_code is True
    assert cls.from_namespace(parser.parse_args([*argv, "--no-trust-remote-code"])).trust_remote_code is False
    assert cls.from_namespace(parser.parse_args([*argv, "--dtype", "fp32"])).dtype == "fp32"


# ---------------------------------------------------------------- fae checkpoints: its own options and fae run's


def test_checkpoints_help_lists_its_options_and_every_run_option_but_output_and_adapter():
    from fae.ablation.checkpoints import CheckpointsConfig

    text = command_parser("fae checkpoints", CheckpointsConfig).format_help()
    sections = _sections(text)
    for flag in ("--training-output DIR", "--output DIR", "--no-plot", "--records", "--rounds", "--config YAML"):
        assert flag in sections["options"], flag
    assert "where each checkpoint's run" in sections["options"] and "--batch-size" in sections["hf backend"]
    assert "--adapter" not in text and not re.findall(r"--[a-z]+_[a-z_]+", text)
    assert text.count("--output") == 2  # usage and its own help line: fae run's --output is not offered


@pytest.mark.parametrize("adapter", [["--adapter", "x"], ["--adapter=x"], ["--adapter"]])
def test_checkpoints_refuses_adapter_with_one_line(adapter, capsys):
    from fae.cli import main

    assert main(["checkpoints", "--training-output", "t", "--output", "o", *adapter, "--records", "r"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "fae checkpoints: error: --adapter is set per checkpoint; give --training-output"]


def test_checkpoints_reads_the_run_options_as_fae_run_does(tmp_path):
    from fae.ablation.checkpoints import CheckpointsConfig

    def parse_args(argv):
        return parse_command_line(CheckpointsConfig, argv, "fae checkpoints")

    cfg = tmp_path / "eval.yaml"
    cfg.write_text("model: m\nrounds: 2\nprogress: false\nbatch-size: 3\n")
    config, context = parse_args(["--training-output", "t", "--output", "o", "--records", "r", "--config",
                                  str(cfg), "--progress", "--max-new-tokens", "9", "--no-plot"])
    assert (config.training_output, config.output, config.plot) == ("t", "o", False)
    run = config.run_options
    assert (run.model, run.rounds, run.progress, run.batch_size, run.max_new_tokens) == ("m", 2, True, 3, 9)
    assert (run.output, run.adapter, run.records) == (None, None, "r") and context["config_file"] == str(cfg)
