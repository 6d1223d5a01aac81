"""A list option given twice keeps every value: ``--budgets 100 200 --budgets 300`` is [100, 200, 300].

The walk covers every list option of every command (tests/command_walk.py: real-data, fae, real-demo,
real-merge, real-import-gguf; and real-train's TRL parser): an option whose argparse action takes a list
(``nargs="+"``, ``"*"``, ``append``) or whose config field is a ``list`` or a mapping (``fae run
--backend-args``). Given twice, its values are kept in order; given once, it replaces the default (never
adds to it), and a default set from a YAML file (defaults < YAML < command line) alike. Fast: no model.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import types
import typing
from pathlib import Path

import pytest

from real_fae_core.command import CommandConfig, add_config_arguments, option
from real_fae_core.errors import UserError
from real_fae_core.flags import is_deprecated

from command_walk import command_parsers, every_parser


def _config_list_fields(cls, seen=None) -> set[str]:
    """Names of the fields of the dataclass ``cls`` (nested configs too) typed a list or a mapping."""
    seen = set() if seen is None else seen
    if cls in seen or not dataclasses.is_dataclass(cls):
        return set()
    seen.add(cls)
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        parts = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        if any(p in (list, dict) or typing.get_origin(p) in (list, dict) for p in parts):
            out.add(f.name)
        for p in parts:
            out |= _config_list_fields(p, seen)
    return out


def _is_list_action(action: argparse.Action, fields: set[str]) -> bool:
    return (action.nargs in ("+", "*") or isinstance(action, (argparse._AppendAction, argparse._ExtendAction))
            or action.dest in fields)


def _parsers() -> dict[str, tuple[argparse.ArgumentParser, set[str]]]:
    """{prog: (its parser, the list- or mapping-typed fields of its config)}: every command, real-train too."""
    out = {prog: (parser, _config_list_fields(cls)) for prog, (_module, cls, parser) in command_parsers().items()}
    from real.training.args import DATACLASSES
    fields = set().union(*(_config_list_fields(cls) for cls in DATACLASSES))
    out["real-train"] = (every_parser()["real-train"], fields)
    return out


PARSERS = _parsers()
LIST_OPTIONS = sorted((prog, max(a.option_strings, key=lambda s: (len(s), s.count("-"))))  # --x-y, not --x_y
                      for prog, (parser, fields) in PARSERS.items() for a in parser._actions
                      if a.option_strings and not is_deprecated(a) and not isinstance(a, argparse._HelpAction)
                      and _is_list_action(a, fields))
MAPPINGS = {"backend_args", "fae_eval"}  # KEY=VALUE,KEY=VALUE strings: repeated, their pairs are joined
# transformers' options of one string that stands for several (a JSON mapping, a comma list): a second use
# cannot be appended, so it is refused (exit 2); every other list option keeps both values
REFUSED = {("real-train", f) for f in ("--accelerator-config", "--activation-checkpointing-kwargs", "--dataset-kwargs",
                                       "--deepspeed", "--fsdp-config", "--gradient-checkpointing-kwargs",
                                       "--lr-scheduler-kwargs", "--model-init-kwargs", "--optim-target-modules",
                                       "--report-to")}
# typed dict alone: no command-line value but None parses (a recipe's mapping only)
NO_VALUE = {("real-train", "--liger-kernel-config")}


def test_the_walk_finds_the_list_options():
    """Not a vacuous walk: the list options named in the issues are among those it checks."""
    assert {("real-data retrieve", "--budgets"), ("real-data retrieve", "--claims"),
            ("real-data retrieve", "--tokenizer"), ("real-data convert", "--claims"),
            ("real-data counterfactual", "--kinds"), ("fae study", "--formats"), ("fae study", "--budgets"),
            ("fae study", "--seeds"), ("fae study", "--tokenizer"), ("fae study-report", "--families"),
            ("fae report", "--names"), ("fae view", "--names"), ("fae probe-report", "--names"),
            ("fae run", "--backend-args"), ("fae checkpoints", "--backend-args"),
            ("real-train", "--lora-target-modules"), ("real-train", "--fae-eval")} <= set(LIST_OPTIONS)
    assert REFUSED <= set(LIST_OPTIONS)


def _usable(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with no option required (each test gives one option only)."""
    for a in parser._actions:
        if a.option_strings:
            a.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    return parser


def _positionals(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each positional argument that needs one (subcommands left out)."""
    out = []
    for a in parser._actions:
        if a.option_strings or isinstance(a, argparse._SubParsersAction) or a.nargs in ("?", "*"):
            continue
        n = a.nargs if isinstance(a.nargs, int) else 1
        out += [str(a.choices[0]) if a.choices else "1"] * n
    return out


def _values(action: argparse.Action) -> tuple[str, str]:
    """Two command-line values the option accepts, different where it can."""
    if action.dest in MAPPINGS:
        return "alpha=1", "beta=two"
    if action.choices:
        choices = [str(getattr(c, "value", c)) for c in action.choices]
        return choices[0], choices[-1]
    if isinstance(action.type, type) and issubclass(action.type, enum.Enum):
        return list(action.type)[0].value, list(action.type)[-1].value
    if action.type in (int, float):
        return "100", "300"
    return "first", "second"


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


def _parse(parser: argparse.ArgumentParser, argv: list[str]):
    return _usable(parser).parse_args(_positionals(parser) + argv)


def _typed(action: argparse.Action, value: str):
    return action.type(value) if callable(action.type) else value


def _no_value(parser: argparse.ArgumentParser, flag: str) -> None:
    with pytest.raises(UserError, match="invalid"):  # still no value to repeat
        _parse(parser, [flag, '{"a": 1}'])


@pytest.mark.parametrize("prog, flag", LIST_OPTIONS, ids=[f"{p} {f}" for p, f in LIST_OPTIONS])
def test_a_list_flag_given_twice_keeps_both_values(prog, flag, capsys):
    parser = PARSERS[prog][0]
    action = _action(parser, flag)
    one, two = _values(action)
    if (prog, flag) in NO_VALUE:
        return _no_value(parser, flag)
    if (prog, flag) in REFUSED:  # or, where appending would be wrong, refuses the second with one line
        with pytest.raises((SystemExit, UserError)) as stop:
            _parse(parser, [flag, one, flag, two])
        message = str(stop.value) if isinstance(stop.value, UserError) else capsys.readouterr().err.splitlines()[-1]
        assert getattr(stop.value, "code", 2) == 2 and message.endswith(f"argument {flag}: given twice; give it once")
        return
    got = getattr(_parse(parser, [flag, one, flag, two]), action.dest)
    if action.dest in MAPPINGS:
        assert got == f"{one},{two}", f"{prog} {flag} {one} {flag} {two}: kept {got!r}"
    else:
        assert got == [_typed(action, one), _typed(action, two)], f"{prog} {flag} {one} {flag} {two}: kept {got!r}"


@pytest.mark.parametrize("prog, flag", LIST_OPTIONS, ids=[f"{p} {f}" for p, f in LIST_OPTIONS])
def test_a_list_flag_given_once_replaces_the_default(prog, flag):
    parser = PARSERS[prog][0]
    action = _action(parser, flag)
    _one, two = _values(action)
    if (prog, flag) in NO_VALUE:
        return _no_value(parser, flag)
    got = getattr(_parse(parser, [flag, two]), action.dest)
    assert got == (two if action.dest in MAPPINGS or (prog, flag) in REFUSED else [_typed(action, two)])


def test_a_list_on_the_command_line_replaces_the_yamls():
    """defaults < YAML < command line: the YAML's list (here the parser's default, as a --config sets it) is
    replaced by the command line's, whose repetitions append."""
    parser = _usable(PARSERS["real-data retrieve"][0])
    parser.set_defaults(budgets=[256, 2048])
    assert parser.parse_args([]).budgets == [256, 2048]
    assert parser.parse_args(["--budgets", "100", "--budgets", "300"]).budgets == [100, 300]


RUN_REQUIRED = ["--records", "r.jsonl", "--output", "o", "--model", "m"]


def parse_options(argv):
    """(the options, the context) of `fae run`'s own words, parsed as the dispatcher parses them."""
    from real_fae_core.cli import parse_command_line
    from fae.ablation.runner import FaeRunConfig

    return parse_command_line(FaeRunConfig, argv, "fae run")


def test_fae_run_backend_args_replace_the_yamls_and_merge(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("backend_args: {gamma: 3}\n")
    options, _ = parse_options(["--config", str(yaml_file), *RUN_REQUIRED])
    assert options.backend_args == {"gamma": 3}
    options, _ = parse_options(["--config", str(yaml_file), *RUN_REQUIRED, "--backend-args", "alpha=1",
                                "--backend-args", "beta=2,alpha=1"])
    assert options.backend_args == "alpha=1,beta=2,alpha=1"


def test_fae_run_backend_args_refuse_a_key_with_two_values(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_options(["--backend-args", "alpha=1", "--backend-args", "alpha=2"])
    assert exit_.value.code == 2
    assert "fae run: error: argument --backend-args: alpha given twice (alpha=1, alpha=2)" in capsys.readouterr().err


def test_a_key_with_two_values_is_refused_from_python_too():
    from fae.ablation.runner import backend_args
    from real.training.fae_callback import parse_pairs

    with pytest.raises(UserError, match="alpha given twice"):
        backend_args("alpha=1,alpha=2", None)
    with pytest.raises(UserError, match="limit given twice"):
        parse_pairs("limit=1,limit=2")
    assert parse_pairs("limit=1,rounds=2,limit=1") == {"limit": 1, "rounds": 2}


def test_real_train_list_replaces_the_recipes_and_appends():
    parser = _usable(every_parser()["real-train"])
    parser.set_defaults_with_config(lora_target_modules=["k_proj"])
    assert parser.parse_args([]).lora_target_modules == ["k_proj"]
    got = parser.parse_args(["--lora-target-modules", "q_proj", "--lora-target-modules", "v_proj"])
    assert got.lora_target_modules == ["q_proj", "v_proj"]


@dataclasses.dataclass
class _Config(CommandConfig):
    budgets: list[int] = option(default_factory=lambda: [1, 2])
    pair: list[str] | None = option(None, repeat=False, help="given in one piece")
    tokenizer: list[str] | None = option(None, action="append")


def test_the_generator_appends_and_refuses_where_told(capsys):
    parser = argparse.ArgumentParser(prog="demo", allow_abbrev=False)
    add_config_arguments(parser, _Config)
    assert parser.parse_args([]).budgets == [1, 2]
    assert parser.parse_args(["--budgets", "3"]).budgets == [3]
    assert parser.parse_args(["--budgets", "3", "4", "--budgets", "5"]).budgets == [3, 4, 5]
    assert parser.parse_args(["--tokenizer", "a", "--tokenizer", "b"]).tokenizer == ["a", "b"]
    assert parser.parse_args(["--pair", "a", "b"]).pair == ["a", "b"]
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--pair", "a", "--pair", "b"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "demo: error: argument --pair: given twice; give its values once (--pair A B ...)"


@dataclasses.dataclass
class _Options:
    layers: list[int] | None = None


def test_option_flags_of_a_backend_append_too():
    """A backend's options embedded in a command (the one generator, add_config_arguments) append too."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(parser, _Options)
    assert parser.parse_args(["--layers", "1", "2", "--layers", "3"]).layers == [1, 2, 3]


# ---------------------------------------------------------------- fae study-report --families A --families B


def test_study_report_reads_every_families_file(tmp_path):
    """recipes/study/reproduce.sh passes --families once per dataset: every file is read (with only the
    last, the first file's units would each be a family of their own)."""
    from fae.cli import main
    from study_helpers import write_study

    studies = [str(write_study(tmp_path / name, model=name)) for name in ("a", "b")]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(json.dumps({"id": f"u{i}", "family": "low"}) + "\n" for i in range(6)))
    second.write_text("".join(json.dumps({"id": f"u{i}", "family": "high"}) + "\n" for i in range(6, 12)))
    out = tmp_path / "report"
    assert main(["study-report", *studies, "--families", str(first), "--families", str(second),
                 "--output", str(out), "--draws", "20", "--exploratory-draws", "20",
                 "--post-hoc-draws", "20"]) == 0
    report = json.loads(next(Path(out).glob("*.json")).read_text())
    assert [p["families"] for p in report["panels"]] == [2, 2]
