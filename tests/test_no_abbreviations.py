"""No abbreviated flags, anywhere: every parser is built with ``allow_abbrev=False``.

argparse takes a unique prefix of a flag for the flag (``--outp`` for ``--output``). A guard that looks
for a flag by its name then misses it: ``fae checkpoints`` sets ``--adapter`` per checkpoint and refuses
it on the command line, ``fae run`` refuses another backend's option; ``--adapt`` and
``--tensor-parallel`` walked past both. Refused, an abbreviation is an unknown flag (exit 2).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from command_walk import every_parser

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}


def repo_python_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py")
                  if not any(part.startswith(".") or part in SKIP_DIRS or part.endswith(".egg-info")
                             for part in p.relative_to(REPO).parts[:-1]))


def parser_calls(path: Path) -> list[ast.Call]:
    """Calls that build a parser: ``...ArgumentParser(``, ``TrlParser(``, a ``Parser(`` subclass, ``add_parser(``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.endswith("Parser") or name == "add_parser":
                out.append(node)
    return out


def refuses_abbreviations(call: ast.Call) -> bool:
    return any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_every_parser_in_the_repository_is_built_without_abbreviations():
    bad, seen = [], 0
    for path in repo_python_files():
        for call in parser_calls(path):
            seen += 1
            if not refuses_abbreviations(call):
                bad.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert seen > 30  # the walk found the parsers (benchmarks, recipes, commands, tests' helpers)
    assert not bad, "parsers that accept abbreviated flags (pass allow_abbrev=False):\n" + "\n".join(bad)


def test_the_source_check_sees_a_parser_that_allows_abbreviations(tmp_path):
    planted = tmp_path / "probe.py"
    planted.write_text("import argparse\np = argparse.ArgumentParser(prog='x')\n"
                       "q = argparse.ArgumentParser(allow_abbrev=False)\ns = q.add_subparsers().add_parser('y')\n")
    assert [refuses_abbreviations(c) for c in parser_calls(planted)] == [False, True, False]


def matched_action(parser, arg: str):
    """The action argparse would give ``arg`` (None: an unknown flag). ``_parse_optional`` returns one
    tuple up to Python 3.11 and a list of them from 3.12 on."""
    got = parser._parse_optional(arg)
    if isinstance(got, list):
        got = got[0] if len(got) == 1 else None
    return got[0] if got else None


def test_every_command_refuses_an_abbreviation_of_each_of_its_flags():
    parsers = every_parser()
    assert {"fae", "fae run", "fae compare", "fae checkpoints", "real-data", "real-train", "real-demo",
            "real-demo build-base", "real-merge", "real-import-gguf", "fae compare (subparser)"} <= set(parsers)
    taken = []
    for name, parser in parsers.items():
        assert parser.allow_abbrev is False, name
        for flag in parser._option_string_actions:
            short = flag[:-1]
            if not flag.startswith("--") or len(short) < 3 or short in parser._option_string_actions:
                continue
            if matched_action(parser, short) is not None:
                taken.append(f"{name}: {short} taken for {flag}")
    assert not taken, "\n".join(taken)


@pytest.mark.parametrize("argv, flag", [
    (["checkpoints", "--training-output", "t", "--output", "o", "--model", "m", "--records", "r.jsonl",
      "--adapt", "a"], "--adapt"),
    (["run", "--backend", "hf", "--model", "m", "--records", "r.jsonl", "--output", "o",
      "--tensor-parallel", "2"], "--tensor-parallel"),
    (["compare", "a", "b", "--outp", "o"], "--output"),
])
def test_an_abbreviation_does_not_pass_a_guard_as_the_flag_it_abbreviates(argv, flag, capsys):
    from fae.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and ("unrecognized arguments" in err or "required" in err), err
