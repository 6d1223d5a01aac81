"""Commands as functions (real_fae_core.command): every subcommand is a typed config plus ``run(config)``.

The walk covers every command of real-data, fae, real-demo, real-merge and
real-import-gguf. For each: its config dataclass (a
:class:`~real_fae_core.command.CommandConfig`: the ``XConfig`` of a subcommand's
``"module:XConfig"`` registry entry, a console script module's ``CONFIG``),
``run``'s first parameter is that config, and the command line is generated from the config
(:func:`~real_fae_core.command.add_config_arguments`): every field is an option,
and a command line of the required arguments parses to the config those values
make in Python, defaults included. So a Python caller and the command line
build the same thing, checked by the same loader. Fast: no model.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing

import pytest

from real_fae_core.command import CommandConfig, CommandResult, check_fields
from real_fae_core.errors import UserError
from real_fae_core.flags import Refused, is_deprecated

from command_walk import command_parsers

COMMANDS = command_parsers()


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """{dest: action} of the options a command offers (help, subcommands and deprecated aliases left out)."""
    out = {}
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        if is_deprecated(a) or a.dest == argparse.SUPPRESS or isinstance(a, Refused):  # a refused option: none
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
    module, cls, _parser = COMMANDS[prog]
    assert cls is not None, f"{prog}: {module.__name__} has no config dataclass"
    assert issubclass(cls, CommandConfig), f"{prog}: {cls.__name__} is not a CommandConfig"
    params = list(inspect.signature(module.run).parameters.values())
    hints = typing.get_type_hints(module.run)
    assert params and hints.get(params[0].name) is cls, f"{prog}: run's first parameter is not a {cls.__name__}"
    assert hints.get("return") is CommandResult, f"{prog}: run does not return a CommandResult"


# Every subcommand is on the one layout: no registry entry is a module name alone, and the two dispatchers are
# the only cli modules.
OLDER_FORM: set[str] = set()
CLI_MODULES = {"fae/cli.py", "data_prep/cli.py"}  # the dispatchers of the console commands


def _registry() -> dict[str, str]:
    """{prog: its registry entry} of every subcommand of fae and real-data."""
    import data_prep.cli
    import fae.cli

    tables = (("fae", fae.cli.SUBCOMMANDS), ("real-data", data_prep.cli.SUBCOMMANDS))
    return {f"{prog} {name}": entry for prog, table in tables for name, (entry, _help) in table.items()}


@pytest.mark.parametrize("prog", sorted(set(_registry()) - OLDER_FORM))
def test_every_subcommand_is_one_module_holding_its_config_and_run(prog):
    """The one layout (docs/architecture.md): the registry names ``"package.module:XConfig"``; that library module
    defines the config dataclass and ``run``; the parser is the dispatcher's, generated from the config, so the
    module has no ``add_arguments`` and no ``CONFIG`` alias."""
    import importlib

    entry = _registry()[prog]
    module_name, sep, config_name = entry.partition(":")
    assert sep and config_name, f"{prog}: registry entry {entry!r} is not 'package.module:XConfig'"
    module = importlib.import_module(module_name)
    cls = getattr(module, config_name, None)
    assert isinstance(cls, type) and issubclass(cls, CommandConfig), f"{prog}: {entry}: no CommandConfig {config_name}"
    assert cls.__module__ == module_name, f"{prog}: {config_name} is defined in {cls.__module__}, not {module_name}"
    run = getattr(module, "run", None)
    assert callable(run) and run.__module__ == module_name, f"{prog}: {module_name} defines no run(config)"
    assert not hasattr(module, "add_arguments") and not hasattr(module, "CONFIG"), \
        f"{prog}: {module_name} declares a parser or a CONFIG beside its registry entry"
    assert COMMANDS[prog].config is cls


def test_no_registry_entry_is_the_older_form():
    """No registry entry is a module name alone (the older form: its own parser, a ``CONFIG`` alias)."""
    older = {prog for prog, entry in _registry().items() if ":" not in entry}
    assert older <= OLDER_FORM, f"on the older registry form: {sorted(older - OLDER_FORM)}"


def test_no_cli_module_but_the_dispatchers_and_the_older_form():
    """A command is its library module; no ``cli.py`` / ``*_cli.py`` shell re-exports it."""
    from helpers import REPO

    found = {str(p.relative_to(REPO)) for package in ("fae", "data_prep") for p in (REPO / package).rglob("*.py")
             if p.stem == "cli" or p.stem.endswith("_cli")}
    assert found <= CLI_MODULES, f"cli modules beside the dispatchers: {sorted(found - CLI_MODULES)}"


def _unexposed(parser: argparse.ArgumentParser, cls: type) -> tuple[list[str], list[str]]:
    """(fields of ``cls`` with no option on ``parser``, options of ``parser`` that are no field of ``cls``): a
    nested config's fields stand for its field (but those its metadata ``exclude``s), and ``--config`` is an
    option of a config that takes a YAML file (``CONFIG_FILE``)."""
    from real_fae_core.command import field_names, nested_fields

    options = set(_options(parser)) - ({"config"} if getattr(cls, "config_file_types", list)() else set())
    nested = nested_fields(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init and f.name not in nested}
    for inner, exclude in nested.values():
        fields |= {name for name in field_names(inner) if name not in exclude}
    return sorted(fields - options), sorted(options - fields)


def _required_command_line(parser: argparse.ArgumentParser) -> tuple[list[str], dict]:
    """(a command line giving every required argument of ``parser``, the values it gives, typed, by field):
    a choice's first value, 1 for a number, "x" for a string; one argument of a required exclusive group."""
    argv, values = [], {}
    chosen = {id(g._group_actions[0]) for g in parser._mutually_exclusive_groups if g.required}
    for name, a in _options(parser).items():
        if not (a.required or id(a) in chosen or (not a.option_strings and a.nargs not in ("?", "*"))):
            continue
        word = str(list(a.choices)[0]) if a.choices else "1" if a.type in (int, float) else "x"
        words = [word] if a.nargs is None or a.nargs == "?" else [word, word]
        argv += [*(a.option_strings[:1]), *words]
        typed = [a.type(w) if a.type else w for w in words]
        values[name] = typed if len(typed) > 1 else typed[0]
    return argv, values


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_every_field_of_the_config_is_an_option_of_the_command(prog):
    """The parser is generated from the config (real_fae_core.command.add_config_arguments):
    a field left out of it, or an option declared beside it, is named."""
    _module, cls, parser = COMMANDS[prog]
    hidden, extra = _unexposed(parser, cls)
    assert not hidden and not extra, (f"{prog}: fields of {cls.__name__} with no option: {hidden}; "
                                      f"options that are no field: {extra}")


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_a_parsed_command_line_is_the_config(prog):
    """A command line of only the required arguments parses to the config those values make in Python: every
    default the command line gives is the config's, every required argument is a required field."""
    from real_fae_core.command import nested_fields

    _module, cls, parser = COMMANDS[prog]
    argv, values = _required_command_line(parser)
    parsed = _config_of(cls, parser, argv)
    for name, (inner, exclude) in nested_fields(cls).items():  # `fae checkpoints`: fae run's options
        values[name] = inner(**{k: values.pop(k) for k in list(values) if k in init_names(inner) - set(exclude)})
    assert parsed == cls(**values), f"{prog}: `{' '.join(argv)}` parses to {parsed}, not {cls(**values)}"
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert not missing, f"{prog}: required in {cls.__name__} but not on the command line: {missing}"


def init_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def _config_of(cls: type, parser: argparse.ArgumentParser, argv: list[str]):
    """The config the dispatcher makes of ``argv`` on the command's ``parser`` (no check that needs the whole
    command line: `fae run`'s required options are optional fields)."""
    values = {k: v for k, v in vars(parser.parse_args(argv)).items() if k != "config"}
    return cls.from_parsed(values, parser, {})


def test_a_field_left_off_the_command_line_is_found():
    """The checks above see a config field the parser lacks, and an option that is no field."""
    from real_fae_core.command import add_config_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(parser, _Example, ["records", "names"])
    parser.add_argument("--stray")
    assert _unexposed(parser, _Example) == (["rounds"], ["stray"])


def test_the_generated_parser_keeps_the_command_line_conventions(capsys):
    """Positional arguments, aliases, deprecated spellings, --no-x, lists, choices and exclusive groups come
    from field metadata, and parse to the config."""
    from real_fae_core.command import add_config_arguments, option

    @dataclasses.dataclass
    class Options(CommandConfig):
        run_dir: str = option(positional=True, metavar="RUN_DIR", deprecated=("--run",), help="a run")
        output: str = option(aliases=("-o",), help="where")
        kinds: list[str] = option(default_factory=lambda: ["a", "b"], help="kinds")
        level: typing.Literal["low", "high"] = option("low")
        progress: bool = True
        include: bool = option(False, deprecated=("--keep",))
        gguf: str | None = option(None, exclusive="source")
        package: str | None = option(None, exclusive="source")

    parser = argparse.ArgumentParser(prog="p", allow_abbrev=False)
    add_config_arguments(parser, Options)
    args = parser.parse_args(["--run", "r", "-o", "out", "--kinds", "c", "d", "--level", "high", "--no-progress",
                              "--keep", "--package", "pkg"])
    assert Options.from_namespace(args) == Options(run_dir="r", output="out", kinds=["c", "d"], level="high",
                                                   progress=False, include=True, package="pkg")
    err = capsys.readouterr().err
    assert "p: warning: --run is deprecated" in err and "p: warning: --keep is deprecated; use --include" in err
    for argv in (["r", "--output", "o"], ["r", "--output", "o", "--gguf", "g", "--package", "p"],
                 ["r", "--output", "o", "--gguf", "g", "--level", "mid"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert "--level {low,high}" in parser.format_help() and "--output OUTPUT, -o OUTPUT" in parser.format_help()


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_a_parsed_command_line_becomes_the_config(prog):
    """The defaults a bare command line gives (required ones filled) build the config without an error."""
    _module, cls, parser = COMMANDS[prog]
    values = {}
    for name, action in _options(parser).items():
        if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            values[name] = ["x"] if action.nargs in ("+", "*") else "x"
        else:
            values[name] = action.default
    values.pop("config", None)
    config = cls.from_parsed(values, parser, {})
    assert isinstance(config, cls)


@pytest.mark.parametrize("prog, argv", [
    ("fae run", ["--records", "r.jsonl", "--output", "o", "--model", "m"]),
    ("fae checkpoints", ["--training-output", "t", "--output", "o", "--records", "r.jsonl"]),
])
def test_a_config_file_command_gets_its_config_and_the_command_line(prog, argv):
    """A command whose config takes ``--config YAML`` is parsed by the dispatcher as every other (defaults < the
    file < the command line); its ``run`` gets the command line as given and the file."""
    from real_fae_core.cli import parse_command_line

    _module, cls, _parser = COMMANDS[prog]
    config, context = parse_command_line(cls, argv, prog)
    assert isinstance(config, cls)
    assert context == {"command": prog + " " + " ".join(argv), "config_file": None}


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


# ---------------------------------------------------------------------------
# real-data commands called from Python: the same files as the command line
# ---------------------------------------------------------------------------


def _write_jsonl(path, objs):
    import json

    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs), encoding="utf-8")
    return path


def _without(summary: dict, *keys) -> dict:
    return {k: v for k, v in summary.items() if k not in keys}


@pytest.mark.parametrize("dataset, claims, corpus", [
    ("check-covid", "check-covid/covidCheck_dev_composed+extracted.json", "check-covid/corpus.json"),
    ("scifact", "scifact/claims_dev.jsonl", "scifact/corpus_cited.jsonl"),
])
def test_convert_from_python_writes_what_the_command_line_writes(tmp_path, capsys, dataset, claims, corpus):
    import json

    from data_prep.cli import main as real_data
    from data_prep.converters.convert import ConvertConfig, run
    from helpers import SAMPLE_DATA

    claims, corpus = SAMPLE_DATA / claims, SAMPLE_DATA / corpus
    cli_out, py_out = tmp_path / "cli.jsonl", tmp_path / "py.jsonl"
    assert real_data(["convert", "--dataset", dataset, "--claims", str(claims), "--corpus", str(corpus),
                      "--output", str(cli_out), "--include-nei"]) == 0
    result = run(ConvertConfig(dataset=dataset, claims=[claims], corpus=corpus, output=py_out, include_nei=True))
    assert result.ok and result.outputs == {"records": str(py_out), "summary": f"{py_out}.summary.json"}
    assert py_out.read_bytes() == cli_out.read_bytes()
    cli_summary = json.loads((tmp_path / "cli.jsonl.summary.json").read_text())
    assert _without(result.summary, "seconds", "output") == _without(cli_summary, "seconds", "output")
    assert result.summary["records_written"] == sum(result.summary["labels"].values()) > 0
    capsys.readouterr()


def test_convert_checks_hold_for_a_python_caller(tmp_path):
    from data_prep.converters.convert import ConvertConfig, run
    from helpers import SAMPLE_DATA

    claims = SAMPLE_DATA / "scifact/claims_dev.jsonl"
    with pytest.raises(UserError, match=r"^ConvertConfig: max_pool_tokens: must be >= 1, got 0$"):
        ConvertConfig(dataset="scifact", claims=[claims], output=tmp_path / "o.jsonl", max_pool_tokens=0)
    with pytest.raises(UserError, match=r"--dataset scifact needs --corpus"):
        run(ConvertConfig(dataset="scifact", claims=[claims], output=tmp_path / "o.jsonl"))
    with pytest.raises(UserError, match=r"--dataset 'nope': unknown; choose from check-covid"):
        run(ConvertConfig(dataset="nope", claims=[claims], output=tmp_path / "o.jsonl"))
    assert not (tmp_path / "o.jsonl").exists()


def test_validate_from_python_returns_the_exit_code_and_the_same_report(tmp_path, capsys):
    from data_prep.cli import main as real_data
    from data_prep.validate.runner import ValidateConfig, run
    from helpers import make_record_dict

    good = _write_jsonl(tmp_path / "good.jsonl", [make_record_dict(id="a"), make_record_dict(id="b")])
    result = run(ValidateConfig(records=good))
    assert result.ok and result.summary == {"records": str(good), "ok": True, "valid": 2}
    assert capsys.readouterr().out == f"{good}: 2 valid records\n"

    bad = _write_jsonl(tmp_path / "bad.jsonl", [make_record_dict(id="a"), make_record_dict(id="b", label="X")])
    assert real_data(["validate", str(bad), "--report", str(tmp_path / "cli.json")]) == 2
    cli_err = capsys.readouterr().err
    result = run(ValidateConfig(records=bad, report=tmp_path / "py.json"))
    assert result.exit_code == 2 and result.outputs == {"report": str(tmp_path / "py.json")}
    assert (tmp_path / "py.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    assert result.summary["invalid"] == 1 and result.summary["valid"] == 1 and not result.summary["ok"]
    err = capsys.readouterr().err
    assert err == cli_err.replace("cli.json", "py.json")
    assert err.strip() == f"real-data validate: error: {bad}: 1 invalid of 2 records (report: {tmp_path / 'py.json'})"

    result = run(ValidateConfig(records=bad))  # stopping at the first bad line: exit 2 as well
    assert result.exit_code == 2 and result.summary["first_error"]["line"] == 2
    assert "bad.jsonl:2: record 'b': field 'label'" in capsys.readouterr().err
    with pytest.raises(UserError, match="records file not found"):
        run(ValidateConfig(records=tmp_path / "missing.jsonl"))


def test_pairs_from_python_writes_what_the_command_line_writes(tmp_path, capsys):
    import json

    from data_prep.cli import main as real_data
    from data_prep.pairs.runner import PairsConfig, run
    from helpers import make_record_dict

    pool = [{"id": 0, "text": "The sky appears blue by day.", "doc": "Sky"}, {"id": 1, "text": "Grass is green."},
            {"id": 2, "text": "Clouds are white.", "doc": "Sky"}]
    records = _write_jsonl(tmp_path / "r.jsonl", [
        make_record_dict(id="a", label="SUPPORT", sentences=pool, evidence=[[0]], enhanced_evidence=[0, 2]),
        make_record_dict(id="b", label="REFUTE", sentences=pool, evidence=[[1]], enhanced_evidence=[1]),
        make_record_dict(id="n", label="NOT_ENOUGH_INFO", sentences=pool, evidence=[]),
    ])
    assert real_data(["pairs", "--records", str(records), "--variant", "real", "--output", str(tmp_path / "cli"),
                      "--seed", "7"]) == 0
    result = run(PairsConfig(records=records, variant="real", output=tmp_path / "py", seed=7))
    py = tmp_path / "py"
    assert result.ok and result.outputs == {"dataset": str(py), "pairs": str(py / "pairs.jsonl"),
                                            "stats": str(py / "stats.json")}
    for name in ("pairs.jsonl", "stats.json"):
        assert (py / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    assert result.summary == json.loads((py / "stats.json").read_text()) and result.summary["pairs"] > 0
    capsys.readouterr()

    with pytest.raises(UserError, match=r"^PairsConfig: max_length: must be >= 1, got -1$"):
        PairsConfig(records=records, variant="real", output=tmp_path / "o", max_length=-1)
    with pytest.raises(UserError, match=r"^PairsConfig: seed: must be an integer, got 'x'$"):
        PairsConfig(records=records, variant="real", output=tmp_path / "o", seed="x")
    with pytest.raises(UserError, match=r"is not empty \(pass --overwrite"):
        run(PairsConfig(records=records, variant="real", output=py))
    with pytest.raises(UserError, match=r"--variant 'bogus': unknown"):
        run(PairsConfig(records=records, variant="bogus", output=tmp_path / "o"))


@pytest.mark.parametrize("module, cls, values, match", [
    ("data_prep.counterfactual.audit", "AuditConfig", {"size": -3}, r"^AuditConfig: size: must be >= 1, got -3$"),
    ("data_prep.counterfactual.audit", "AuditConfig", {"raters": 1}, r"^AuditConfig: raters: must be >= 2, got 1$"),
    ("data_prep.enhance.runner", "EnhanceConfig", {"min_votes": 0}, r"^EnhanceConfig: min_votes: must be >= 1, got 0$"),
    ("data_prep.enhance.runner", "EnhanceConfig", {"max_in_flight": -1},
     r"^EnhanceConfig: max_in_flight: must be >= 1, got -1$"),
    ("data_prep.counterfactual.runner", "CounterfactualConfig", {"min_overlap": 1.5},
     r"^CounterfactualConfig: min_overlap: must be <= 1, got 1.5$"),
    ("data_prep.counterfactual.runner", "CounterfactualConfig", {"entity_method": "magic"},
     r"^CounterfactualConfig: entity_method: must be one of rules, llm, got 'magic'$"),
])
def test_a_bad_value_built_in_code_is_one_error_naming_the_field(module, cls, values, match):
    import importlib

    config_cls = getattr(importlib.import_module(module), cls)
    with pytest.raises(UserError, match=match):
        config_cls(records="r.jsonl", output="o", **values)
