"""Every `fae` and `real-data` command line the docs and recipes show parses to the config it parsed to when
tests/data/documented_commands.json was written: a refactor of the parsers (one generator for every command)
keeps the published command lines and what they mean.

The lines come from README.md, docs/*.md and recipes/**/*.md (shell lines of the code blocks), recipes/**/*.yaml
(the commented `#   fae run ...` usage lines) and recipes/**/*.sh (`fae X` / `real-data X` words of a shell
line, e.g. after `step ... --`), backslash continuations joined. Shell placeholders become fixed words
(:data:`SUBSTITUTIONS`; ``$X`` / ``${X}`` / ``"$X"``: ``x``, ``<a b>``: ``a-b``; ``$(...)`` and ``$X_ARGS``, which
add optional flags, are dropped), so each line is one argv. Each is parsed as ``fae`` / ``real-data`` parse it
(:func:`parse_command`), without running it, from the repository root (``--config recipes/eval/X.yaml`` is read),
to ``dataclasses.asdict`` of its config (and, for a command with its own parser, the ``--config`` file it read),
or to the one-line error it gives.

Rewrite the fixture with ``python tests/test_documented_commands.py --write`` after a deliberate change (a new
documented command, a changed meaning), and say why in the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "documented_commands.json"
PROGS = ("fae", "real-data")

# shell variables whose placeholder word would not parse (a --config file must exist: one of the repository's;
# a number, the script's default; a choice, one of its values)
SUBSTITUTIONS = {
    "MAX_LENGTH": "4096", "AUDIT_SIZE": "100", "NEURONS_LIMIT": "500", "CONTROL_CLAIMS": "16",
    "BACKEND": "vllm", "VARIANT": "real", "variant": "real", "COUNTERFACTUAL_KINDS": "entity", "RERANKER_KIND": "cross-encoder", "dataset": "scifact", "format": "scifact",
    "MODEL_ID": "smollm2-135m-instruct",
    "EVAL_CONFIG": "recipes/eval/smollm2-135m-instruct.yaml",
    "tokenizers": "--tokenizer model_a --tokenizer model_b",  # recipes/study/reproduce.sh: flags, not positionals
}

# the required options an inline span leaves out (`fae run --line-ids renumbered`); --model only without --config
PADDING = {
    "run": [("--records", "records.jsonl"), ("--output", "run"), ("--model", "model")],
    "checkpoints": [("--training-output", "training"), ("--output", "out"), ("--records", "records.jsonl")],
}


# ---------------------------------------------------------------------------
# finding the command lines
# ---------------------------------------------------------------------------

def _sources() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "recipes").rglob("*.md"))]
    return [*pages, *sorted((ROOT / "recipes").rglob("*.yaml")), *sorted((ROOT / "recipes").rglob("*.sh"))]


def _joined(lines: list[str]) -> list[str]:
    """Lines with their backslash continuations joined."""
    out, current = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


_START = re.compile(r"(?:^|(?<=\s--\s)|(?<=\|\|\s)|(?<=&&\s))(?:\$FAE|fae|real-data)\s[a-z][\w-]*(?=\s|$)")
_SUBSHELL = re.compile(r"\$\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")


def _commands_in(text: str, anywhere: bool) -> list[str]:
    """The `fae X ...` / `real-data X ...` commands of shell lines: at a line's start (after a ``$ `` prompt),
    or (``anywhere``: a script) also where a command starts after ``--``, ``||`` or ``&&``, up to the end of
    that shell command. ``"$(...)"`` (a value) becomes ``"value"``, an unquoted ``$(...)`` (optional flags)
    and ``${X:+...}`` are dropped. A line the program printed (``fae run: error: ...``) is no command."""
    out = []
    for line in _joined(text.splitlines()):
        line = line.strip()
        line = line[2:] if line.startswith("$ ") else line
        if line.startswith("#"):
            continue
        line = _SUBSHELL.sub(lambda m: "value" if m.string[m.start() - 1:m.start()] == '"' else " ", line)
        line = re.sub(r"\$\{\w+:\+[^{}]*\}", " ", line)
        for m in _START.finditer(line):
            out.append(line[m.start():])
            if not anywhere:
                break
    cut = []
    for cmd in out:
        cmd = re.sub(r"^\$FAE\s", "fae ", cmd)
        cmd = re.split(r"\s(?:;;|;|&&|\|\||\|)(?:\s|$)|\s#|\s>", cmd + " ", maxsplit=1)[0].strip()
        cut.append(" ".join(cmd.split()))
    return cut


def documented_lines() -> list[tuple[str, str]]:
    """(file, command line as written, continuations joined) of every documented `fae` / `real-data` command."""
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix == ".md":
            blocks = re.findall(r"^ *```([a-z]*)\n(.*?)^ *```", text, flags=re.M | re.S)
            cmds = [c for lang, block in blocks if lang not in ("json", "python", "yaml", "text")
                    for c in _commands_in(block, anywhere=False)]
            prose = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
            cmds += [f"`{span}`" for span in re.findall(r"`(fae (?:run|checkpoints) [^`\n]+)`", prose)]
        elif path.suffix == ".yaml":
            comments = [line.lstrip("#") for line in text.splitlines() if line.startswith("#")]
            cmds = _commands_in("\n".join(comments), anywhere=False)
        else:
            cmds = _commands_in(text, anywhere=True)
        for cmd in cmds:
            if (rel, cmd) not in found:
                found.append((rel, cmd))
    return found


def argv_of(line: str) -> list[str]:
    """The words of a documented line, its placeholders replaced by fixed words: ``$X_ARGS`` (optional extra
    flags, empty by default) dropped, an array ``"${X[@]}"`` and a variable ``$X`` / ``${X}`` / ``"$X"`` by
    :data:`SUBSTITUTIONS` or its name in lower case, ``<a b>`` by ``a-b``, an optional ``[--x A|B]`` by
    ``--x A``, ``...`` dropped. An inline span (`` `fae run --dtype fp32` ``, a part of a command) gets the
    required options it does not name (:data:`PADDING`)."""
    if line.startswith("`"):
        words = ["4" if w == "N" else w for w in argv_of(line.strip("`"))]  # --shards N
        for flag, value in PADDING[words[1]]:
            if flag not in words and not (flag == "--model" and "--config" in words):
                words += [flag, value]
        return words
    line = re.sub(r"\$\{?[A-Z_]*_ARGS\}?", " ", line)
    line = re.sub(r'"?\$\{(\w+)\[@\]\}"?', lambda m: SUBSTITUTIONS.get(m.group(1), m.group(1)), line)
    line = line.replace('"$@"', "args")

    def variable(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return SUBSTITUTIONS.get(name, name.lower())

    line = re.sub(r"\$\{(\w+)\}|\$(\w+)", variable, line)
    line = re.sub(r"<([^<>]+)>", lambda m: re.sub(r"\W+", "-", m.group(1)).strip("-"), line)
    line = re.sub(r"\[(--[^\[\]]*)\]", r"\1", line)
    words = [w.split("|")[0] if re.fullmatch(r"\w+(\|\w+)+", w) else w for w in shlex.split(line)]
    return [w for w in words if w not in ("...", "…")]


# ---------------------------------------------------------------------------
# parsing a line as the dispatcher does, without running it
# ---------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _parser(prog: str):
    from real_fae_core.cli import build_parser

    table = importlib_module("fae.cli" if prog == "fae" else "data_prep.cli")
    return build_parser(prog, table.__doc__, table.SUBCOMMANDS)


def importlib_module(name: str):
    import importlib

    return importlib.import_module(name)


def _plain(value):
    return json.loads(json.dumps(value, default=str))


def parse_command(argv: list[str]) -> dict:
    """``{"config": asdict of the command's config, ...}`` of ``fae ...`` / ``real-data ...`` as dispatch parses
    it (a command with its own parser: also ``config_file``), or ``{"error": its one line}`` (``{"help": true}``
    for --help)."""
    prog, rest = argv[0], [a for a in argv[1:] if a != "--debug"]  # run_guarded takes it anywhere
    parser, modules = _parser(prog)
    err = io.StringIO()
    return _project_backends_only(_parse(parser, modules, prog, rest, err))


def _project_backends_only(result: dict) -> dict:
    """The result as a user sees it: the backends other test modules register at import (``test-echo``) left
    out of an error line that names the backends available."""
    from fae import backends

    def keep(match: re.Match) -> str:
        names = [n for n in match.group(1).split(", ")
                 if backends.get_backend(n).__module__.startswith("fae.")]
        return f"(available: {', '.join(names)})"

    if "error" in result:
        result["error"] = re.sub(r"\(available: ([^)]*)\)", keep, result["error"])
    return result


def _parse(parser, modules, prog: str, rest: list[str], err: io.StringIO) -> dict:
    """The body of :func:`parse_command`."""
    from real_fae_core.cli import parse_command as parse_as_dispatched

    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, _extra = parser.parse_known_args(rest)
            cls = modules[args.command].config
            if cls.config_file_types():  # `fae run`, `fae checkpoints`: a --config file's values become defaults
                parser = _parser.__wrapped__(prog)[0]  # of a fresh parser
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
            config, context = parse_as_dispatched(parser, rest, cls, f"{prog} {args.command}",
                                                  rest[rest.index(args.command) + 1:], sub[args.command])
            if cls.config_file_types():
                return {"config": _plain(dataclasses.asdict(config)), "config_file": context.get("config_file")}
            return {"config": _plain(dataclasses.asdict(config))}
    except SystemExit as exc:
        if exc.code == 0:
            return {"help": True}
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {exc.code}"}
    except Exception as exc:  # UserError and the like: the one line the dispatcher prints
        return {"error": f"{type(exc).__name__}: {exc}"}


def documented_configs() -> list[dict]:
    """Every documented command with what it parses to, from the repository root."""
    out = []
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for source, line in documented_lines():
            argv = argv_of(line)
            out.append({"source": source, "line": line, "argv": argv, **parse_command(argv)})
    finally:
        os.chdir(cwd)
    return out


def write() -> None:
    FIXTURE.write_text(json.dumps(documented_configs(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------

def _expected() -> dict[tuple[str, str], dict]:
    if not FIXTURE.is_file():  # before the first --write
        return {}
    return {(e["source"], e["line"]): e for e in json.loads(FIXTURE.read_text(encoding="utf-8"))}


def test_the_scanner_finds_the_documented_commands():
    """Guard against a scanner that silently finds nothing."""
    lines = documented_lines()
    subs = {tuple(argv_of(line)[:2]) for _s, line in lines}
    assert {("fae", "run"), ("fae", "checkpoints"), ("fae", "report"), ("real-data", "enhance")} <= subs
    assert sum(1 for s in subs if s == ("fae", "run")) == 1 and len(lines) >= 40
    assert any(src.endswith(".yaml") for src, _l in lines) and any(src.endswith(".sh") for src, _l in lines)


def test_every_documented_command_is_in_the_fixture():
    """A command added to (or removed from) the docs is in the fixture: rewrite it (module docstring)."""
    documented = set(documented_lines())
    expected = set(_expected())
    assert not documented - expected, ("documented commands missing from tests/data/documented_commands.json "
                                       f"(python tests/test_documented_commands.py --write): "
                                       f"{sorted(documented - expected)}")
    assert not expected - documented, f"fixture entries no longer documented: {sorted(expected - documented)}"


@pytest.mark.parametrize("key", sorted(_expected()), ids=lambda k: f"{k[0]}:{k[1][:60]}")
def test_a_documented_command_parses_to_its_config(key, monkeypatch):
    entry = _expected()[key]
    monkeypatch.chdir(ROOT)
    got = parse_command(entry["argv"])
    want = {k: v for k, v in entry.items() if k not in ("source", "line", "argv")}
    assert got == want, f"{key[0]}: `{key[1]}` parses differently now"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(__doc__)
