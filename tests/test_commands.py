"""Commands as functions (real_fae_core.command): every subcommand is a typed config plus ``run(config)``.

The walk covers every command of real-data, fae, real-demo, real-merge and
real-import-gguf. For each: the module names its config dataclass ``CONFIG``
(a :class:`~real_fae_core.command.CommandConfig`), ``run``'s first parameter is
that config, and the command line and the config agree: the parser's options
are the config's fields, with the same defaults, and an option the parser
requires is a field without a default. So a Python caller and the command line
build the same thing, checked by the same loader. Fast: no model.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing

import pytest

from real_fae_core.command import CommandConfig, CommandResult, check_fields, config_type
from real_fae_core.errors import UserError
from real_fae_core.flags import is_deprecated

from command_walk import command_parsers

COMMANDS = command_parsers()
# `fae run` and `fae checkpoints` parse their own dataclass options (HfArgumentParser): the walk over
# argparse actions does not apply; their parse_args is checked to return their CONFIG instead.
OWN_PARSE = {prog for prog, (module, _p) in COMMANDS.items() if hasattr(module, "parse_args")}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{dest: action} of the options a command offers (help, subcommands and deprecated aliases left out)."""
    out = {}
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        if is_deprecated(a) or a.dest == argparse.SUPPRESS:
            continue
        out.setdefault(a.dest, a)
    return out


def _field_default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def test_the_walk_sees_every_command():
    assert {"fae run", "fae pave", "real-data enhance", "real-demo", "real-demo build-base", "real-merge",
            "real-import-gguf"} <= set(COMMANDS)
    assert len(COMMANDS) >= 22


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_every_command_is_a_typed_config_and_a_run_function(prog):
    module, _parser = COMMANDS[prog]
    cls = config_type(module)
    assert cls is not None, f"{prog}: {module.__name__} has no CONFIG dataclass"
    assert issubclass(cls, CommandConfig), f"{prog}: {cls.__name__} is not a CommandConfig"
    params = list(inspect.signature(module.run).parameters.values())
    hints = typing.get_type_hints(module.run)
    assert params and hints.get(params[0].name) is cls, f"{prog}: run's first parameter is not a {cls.__name__}"
    assert hints.get("return") is CommandResult, f"{prog}: run does not return a CommandResult"


@pytest.mark.parametrize("prog", sorted(set(COMMANDS) - OWN_PARSE))
def test_the_parser_options_are_the_config_fields_with_the_same_defaults(prog):
    module, parser = COMMANDS[prog]
    cls = config_type(module)
    options = _options(parser)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    assert set(options) == set(fields), (f"{prog}: only on the command line: {sorted(set(options) - set(fields))}; "
                                         f"only in {cls.__name__}: {sorted(set(fields) - set(options))}")
    for name, action in options.items():
        f = fields[name]
        required = action.required or (not action.option_strings and action.nargs not in ("?", "*"))
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert required == (not has_default), f"{prog}: {name}: required on the command line but not in the config" \
            if required else f"{prog}: {name}: the config requires what the command line does not"
        if not required:
            assert action.default == _field_default(f), \
                f"{prog}: {name}: command line default {action.default!r}, config default {_field_default(f)!r}"


@pytest.mark.parametrize("prog", sorted(set(COMMANDS) - OWN_PARSE))
def test_a_parsed_command_line_becomes_the_config(prog):
    """The defaults a bare command line gives (required ones filled) build the config without an error."""
    module, parser = COMMANDS[prog]
    cls = config_type(module)
    values = {}
    for name, action in _options(parser).items():
        if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            values[name] = ["x"] if action.nargs in ("+", "*") else "x"
        else:
            values[name] = action.default
    config = cls.from_namespace(argparse.Namespace(**values, command="ignored"))
    assert isinstance(config, cls)


@pytest.mark.parametrize("prog, argv", [
    ("fae run", ["--records", "r.jsonl", "--output", "o", "--model", "m"]),
    ("fae checkpoints", ["--training-output", "t", "--output", "o", "--records", "r.jsonl"]),
])
def test_an_own_parser_returns_its_config_and_the_command_line(prog, argv):
    module, _parser = COMMANDS[prog]
    config, context = module.parse_args(argv, prog)
    assert isinstance(config, config_type(module))
    assert context["command"] == prog + " " + " ".join(argv)


# ---------------------------------------------------------------------------
# the loader's checks hold for a Python caller
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Example(CommandConfig):
    records: str
    rounds: int = dataclasses.field(default=4, metadata={"min": 0})
    names: list[str] | None = None


def test_a_config_built_in_code_is_checked_like_a_flag():
    from pathlib import Path

    assert _Example(records=Path("a/b.jsonl")).records == "a/b.jsonl"  # a path is a str field's value
    assert _Example(records="r", names=("a", "b")).names == ["a", "b"]
    assert _Example(records="r", names=[Path("a"), "b"]).names == ["a", "b"]
    assert _Example.from_mapping({"records": Path("r"), "names": (Path("x"),)}).names == ["x"]
    assert _Example(records="r", rounds=2.0).rounds == 2
    with pytest.raises(UserError, match=r"^_Example: rounds: must be >= 0, got -1$"):
        _Example(records="r", rounds=-1)
    with pytest.raises(UserError, match=r"^_Example: rounds: must be an integer, got 'four'$"):
        _Example(records="r", rounds="four")
    with pytest.raises(UserError, match=r"names: list items must be a string"):
        _Example(records="r", names=[1, [2]])


def test_from_mapping_and_from_yaml_name_the_key(tmp_path):
    assert _Example.from_mapping({"records": "r", "rounds": 3}).rounds == 3
    with pytest.raises(UserError, match=r"^options: round: unknown key \(did you mean 'rounds'\?\)$"):
        _Example.from_mapping({"records": "r", "round": 3})
    with pytest.raises(UserError, match=r"records: missing required field"):
        _Example.from_mapping({"rounds": 3})
    path = tmp_path / "c.yaml"
    path.write_text("records: r\nrounds: -2\n")
    with pytest.raises(UserError, match=rf"^{path}:2: rounds: must be >= 0, got -2$"):
        _Example.from_yaml(path)


def test_check_fields_converts_in_place():
    ex = _Example(records="r")
    ex.rounds = 5.0
    check_fields(ex)
    assert ex.rounds == 5 and isinstance(ex.rounds, int)
