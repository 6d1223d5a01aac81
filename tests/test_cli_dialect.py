"""One flag dialect: each idea has one spelling across real-data, fae, real-demo, real-merge, real-import-gguf.

The spellings chosen, and why:

- NOT_ENOUGH_INFO records: ``--include-nei``. It says what it does (the
  records are included in what is read or written), and two commands
  (``real-data enhance``, ``fae neurons``) already said it.
- names of the runs shown: ``--names`` (``fae report``, ``fae view``,
  ``fae probe-report``): the runs are named, the legend is one use of the name.
- the run directory: the positional ``RUN_DIR`` where a run is the command's
  main input (``fae report``, ``fae view``, ``fae merge``, ``fae probe``), as
  ``fae compare RUN_A RUN_B``. A run that is only an optional extra is a flag
  named for its role with metavar ``RUN_DIR``: ``fae pave --check-run RUN_DIR``
  (a cross-check of PAVE's accuracy; ``--compare-run`` would suggest
  ``fae compare``'s accounting, and ``--fae-run`` names the tool, not the role).
- lists: space-separated values (``nargs="+"``), as every other list flag:
  ``--kinds entity semantic``.

Old spellings stay accepted until 0.2 through :mod:`real_fae_core.flags`, hidden
from ``--help``, with one warning line. The parsers are built as the
entry points build them (``dispatch``'s ``build_parser``; ``fae run`` and
``fae checkpoints`` through their own ``make_parser``). Fast: no model.
"""

from __future__ import annotations

import argparse
import re

import pytest

from real_fae_core.flags import deprecated_positionals, is_deprecated

from command_walk import command_parsers

# idea -> (the one spelling, spellings no command may offer as its own)
IDEAS = {
    "include NOT_ENOUGH_INFO records": ("--include-nei", {"--keep-nei", "--with-nei", "--nei"}),
    "names of the runs": ("--names", {"--labels", "--run-names", "--legend"}),
    "the run directory": ("RUN_DIR", {"--run", "--run-dir", "--fae-run", "--runs"}),
}
# commands whose main input is a run directory: it is the positional RUN_DIR
RUN_INPUT = ["fae report", "fae view", "fae merge", "fae probe"]


def _all_parsers() -> dict[str, argparse.ArgumentParser]:
    """{prog: parser} of every command and subcommand of the five tools."""
    return {prog: walked.parser for prog, walked in command_parsers().items()}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


PARSERS = _all_parsers()


def _own_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings a command offers as its own (deprecated aliases left out)."""
    return {s for a in parser._actions if not is_deprecated(a) for s in a.option_strings}


def test_the_walk_sees_every_tool():
    assert {"real-data convert", "real-data counterfactual", "fae run", "fae checkpoints", "fae probe",
            "fae pave", "real-demo", "real-demo build-base", "real-merge", "real-import-gguf"} <= set(PARSERS)
    assert "--rounds" in _own_flags(PARSERS["fae run"])  # the dataclass parser, not an empty stub


@pytest.mark.parametrize("idea", IDEAS)
def test_one_spelling_per_idea(idea):
    allowed, forbidden = IDEAS[idea]
    wrong = sorted(f"{prog} {flag}" for prog, p in PARSERS.items() for flag in _own_flags(p) & forbidden)
    assert not wrong, f"{idea}: spell it {allowed}, not {wrong}"


@pytest.mark.parametrize("flag", ["--include-nei", "--names"])
def test_the_chosen_spelling_is_in_use(flag):
    users = [prog for prog, p in PARSERS.items() if flag in _own_flags(p)]
    assert len(users) >= 3, users  # the table above stays about the real parsers


@pytest.mark.parametrize("prog", RUN_INPUT)
def test_a_run_as_main_input_is_the_positional_run_dir(prog):
    positional = [a.metavar for a in PARSERS[prog]._actions if not a.option_strings and a.dest != "help"]
    assert positional == ["RUN_DIR"], f"{prog}: {positional}"


def test_optional_run_arguments_say_run_dir():
    runs = {f"{prog} {s}": a.metavar for prog, p in PARSERS.items() for a in p._actions
            if not is_deprecated(a) for s in a.option_strings if s.endswith("-run") and s != "--dry-run"}
    assert runs == {"fae pave --check-run": "RUN_DIR"}


def test_list_flags_take_spaced_values():
    commas = [f"{prog} {a.option_strings}" for prog, p in PARSERS.items() for a in p._actions
              if a.help and a.help is not argparse.SUPPRESS and re.search(r"\bcomma\b", a.help, re.I)]
    assert not commas, f"comma lists: {commas}"
    kinds = PARSERS["real-data counterfactual"]._option_string_actions["--kinds"]
    assert kinds.nargs == "+"


# ---------------------------------------------------------------- old spellings, one release


def _parse(prog: str, argv: list[str]) -> argparse.Namespace:
    return PARSERS[prog].parse_args(argv)


OLD = [  # (command, argv with the old spelling, attribute, expected value, old, new)
    ("real-data convert", ["--dataset", "scifact", "--claims", "c.jsonl", "--output", "o.jsonl", "--keep-nei"],
     "include_nei", True, "--keep-nei", "--include-nei"),
    ("fae probe-report", ["p1", "p2", "--output", "o", "--labels", "a", "b"], "names", ["a", "b"],
     "--labels", "--names"),
    ("fae probe", ["--run", "r", "--model", "m", "--output", "o"], "run_dir", "r",
     "--run", "the positional RUN_DIR (fae probe RUN_DIR ...)"),
    ("fae probe", ["--model", "m", "--run=r", "--output", "o"], "run_dir", "r",
     "--run", "the positional RUN_DIR (fae probe RUN_DIR ...)"),
    ("fae pave", ["--records", "x", "--output", "o", "--model", "m", "--fae-run", "r"], "check_run", "r",
     "--fae-run", "--check-run"),
    ("real-data counterfactual", ["--records", "r", "--output", "o", "--kinds", "entity,semantic"],
     "kinds", ["entity", "semantic"], "a comma list after --kinds", "spaces (--kinds entity semantic)"),
]


@pytest.mark.parametrize("prog,argv,attr,value,old,new", OLD, ids=[f"{o[0]} {o[4]}" for o in OLD])
def test_an_old_spelling_works_with_one_warning(prog, argv, attr, value, old, new, capsys):
    assert getattr(_parse(prog, argv), attr) == value
    err = capsys.readouterr().err
    assert err.splitlines() == [f"{prog}: warning: {old} is deprecated; use {new} (accepted until 0.2)"]


NEW = [
    ("real-data convert", ["--dataset", "scifact", "--claims", "c.jsonl", "--output", "o.jsonl", "--include-nei"],
     "include_nei", True),
    ("fae probe-report", ["p1", "--output", "o", "--names", "a"], "names", ["a"]),
    ("fae probe", ["r", "--model", "m", "--output", "o"], "run_dir", "r"),
    ("fae pave", ["--records", "x", "--output", "o", "--model", "m", "--check-run", "r"], "check_run", "r"),
    ("real-data counterfactual", ["--records", "r", "--output", "o", "--kinds", "entity", "semantic"],
     "kinds", ["entity", "semantic"]),
    ("real-data counterfactual", ["--records", "r", "--output", "o"], "kinds", ["entity", "semantic"]),
]


@pytest.mark.parametrize("prog,argv,attr,value", NEW, ids=[f"{n[0]} {n[1][-1]}" for n in NEW])
def test_the_new_spelling_is_silent(prog, argv, attr, value, capsys):
    got = getattr(_parse(prog, argv), attr)
    assert (list(got) if isinstance(got, tuple) else got) == value
    assert capsys.readouterr().err == ""


def test_old_spellings_are_hidden_from_help():
    for prog in ("real-data convert", "fae probe-report", "fae probe", "fae pave"):
        text = PARSERS[prog].format_help()
        assert not re.search(r"--(keep-nei|labels|fae-run|run)(?![-\w])", text), prog
    assert deprecated_positionals(PARSERS["fae probe"]) == {"--run": "RUN_DIR"}


def test_run_given_twice_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse("fae probe", ["r", "--run", "r2", "--model", "m", "--output", "o"])
    assert exc.value.code == 2


def test_through_the_entry_point_the_old_spelling_still_runs(tmp_path, capsys):
    """`fae probe-report --labels` end to end: the warning names the command and the run ends as with `--names`."""
    from fae.cli import main

    code = main(["probe-report", str(tmp_path / "missing"), "--output", str(tmp_path / "o"), "--labels", "a"])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "fae probe-report: warning: --labels is deprecated; use --names (accepted until 0.2)"
    assert code != 0 and len(err) == 2 and err[1].startswith("fae probe-report: error:")


# ---------------------------------------------------------------- real-demo build-base


def test_build_base_is_an_argparse_subcommand(capsys):
    args = _parse("real-demo", ["build-base", "--output", "b", "--steps", "5", "--final-phase-from", "-1"])
    assert (args.command, args.output, args.steps, args.final_phase_from, args.seed, args.target) == \
        ("build-base", "b", 5, -1, 0, 0.97)
    args = _parse("real-demo", ["--output", "d", "--seed", "3"])
    assert (args.command, args.output, args.seed, args.base) == (None, "d", 3, None)
    with pytest.raises(SystemExit) as exc:
        _parse("real-demo", ["build-base"])
    assert exc.value.code == 2 and "--output" in capsys.readouterr().err
    help_text = PARSERS["real-demo build-base"].format_help()
    assert help_text.startswith("usage: real-demo build-base")
    assert "rebuild the demo base model from scratch" in help_text and "--final-phase-from" in help_text


def test_build_base_after_demo_flags_is_refused(capsys):
    from real.demo import main

    assert main(["--seed", "3", "build-base", "--output", "b"]) == 2
    assert "build-base comes first" in capsys.readouterr().err


def test_an_unknown_kind_is_one_line_naming_the_flag(tmp_path, capsys):
    from data_prep.cli import main

    code = main(["counterfactual", "--records", str(tmp_path / "r.jsonl"), "--output", str(tmp_path / "o.jsonl"),
                 "--kinds", "entity", "bogus"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "real-data counterfactual: error: --kinds: unknown kind 'bogus'; choose from entity, semantic"]
