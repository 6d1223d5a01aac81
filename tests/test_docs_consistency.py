"""The docs describe the code: exit codes, links, commands and flags, examples.

Docs drift silently when code changes (a converter error that became exit 2,
a record example whose evidence ids are not in its pool). These checks read
README.md and docs/*.md and compare them with the code itself: the exit-code
constants, the files on disk, the argparse parsers the CLIs build, and the
record validator. Fast: no model, no subprocess.
"""

from __future__ import annotations

import argparse
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from real_fae_core import errors as core_errors
from real_fae_core.flags import is_deprecated
from data_prep.records import ClaimRecord

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
ids = [p.relative_to(ROOT).as_posix() for p in PAGES]

EXIT_CODES = {v for k, v in vars(core_errors).items() if k.startswith("EXIT_") and isinstance(v, int)}


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


# ---------------------------------------------------------------- exit codes

def test_errors_md_exit_code_table_is_the_dispatch_constants():
    table = re.findall(r"^\| (\d+) \|", _text(ROOT / "docs" / "errors.md"), flags=re.M)
    assert table, "docs/errors.md lost its exit-code table"
    assert sorted(map(int, table)) == sorted(EXIT_CODES)


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_every_exit_code_mentioned_exists(page):
    named = {int(n) for n in re.findall(r"\bexits? (?:code |status )?(\d+)\b", _text(page))}
    assert named <= EXIT_CODES, f"{page.name} names exit codes the code never returns: {named - EXIT_CODES}"


def test_data_md_fatal_convert_errors_state_their_real_exit_code():
    from data_prep.converters.base import InputError

    m = re.search(r"\*\*Fatal\*\* \([^)]*?exit (\d+)", _text(ROOT / "docs" / "data.md"))
    assert m, "docs/data.md: the Fatal bullet states no exit code"
    assert int(m.group(1)) == InputError("f.jsonl", 1, None, "x").exit_code


# ---------------------------------------------------------------- links

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to dashes."""
    out = set()
    in_code = False
    for line in _text(page).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_relative_links_resolve(page):
    broken = []
    for target in _LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.name}: broken links: {broken}"


# ---------------------------------------------------------------- commands and flags

@lru_cache(maxsize=None)
def _cli_flags() -> dict[tuple[str, str], set[str]]:
    """{(prog, subcommand): option strings}, built the way `dispatch` builds the parsers."""
    import data_prep.cli
    import fae.cli
    from real_fae_core.cli import build_parser

    flags = {}
    for prog, mod in (("fae", fae.cli), ("real-data", data_prep.cli)):
        top, commands = build_parser(prog, mod.__doc__, mod.SUBCOMMANDS)
        subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
        for name in commands:
            parser = subparsers[name]
            # an old spelling kept for one release is accepted, but never documented
            flags[prog, name] = {s for a in parser._actions if not is_deprecated(a)
                                 for s in a.option_strings} | {"--debug"}
    return flags


_COMMAND = re.compile(r"(?<![\w/.-])(fae|real-data) ([a-z][\w-]*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def _command_texts(page: Path) -> list[str]:
    """Each shell line of a code block (continuations joined, comments cut) and each inline code span."""
    text = _text(page)
    out = []
    for block in re.findall(r"^```(?:bash|sh|console|shell)?\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            out.append(line.split(" #", 1)[0])
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    out.extend(re.findall(r"`([^`\n]+)`", prose))
    return out


def _mentions(page: Path):
    """(prog, subcommand, flags given after it) for every `fae X` / `real-data X` in the page."""
    for text in _command_texts(page):
        found = list(_COMMAND.finditer(text))
        for i, m in enumerate(found):
            end = found[i + 1].start() if i + 1 < len(found) else len(text)
            rest = re.split(r"[|;]|&&", text[m.end():end], maxsplit=1)[0]  # stop at the next shell command
            yield m.group(1), m.group(2), _FLAG.findall(rest)


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_documented_subcommands_and_flags_exist(page):
    flags = _cli_flags()
    wrong = []
    for prog, sub, given in _mentions(page):
        if (prog, sub) not in flags:
            if prog == "fae" and sub in ("output", "outputs"):  # prose: "fae output files"
                continue
            wrong.append(f"{prog} {sub} (no such subcommand)")
            continue
        wrong += [f"{prog} {sub} {f}" for f in given if f not in flags[prog, sub]]
    assert not wrong, f"{page.name} documents what the parsers do not accept: {sorted(set(wrong))}"


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_flag_tables_list_accepted_flags(page):
    """A table row documenting `--flag` names a flag of a `fae` / `real-data` command that page is about."""
    flags = _cli_flags()
    about = {(p, s) for p, s, _ in _mentions(page) if (p, s) in flags}
    accepted = set().union(*(flags[k] for k in about)) if about else set()
    rows = re.findall(r"^\| `(--[^|]*)\|", _text(page), flags=re.M)
    if not about or page.name == "training.md":  # training.md's tables are real-train's (HfArgumentParser)
        return
    unknown = {f for row in rows for f in _FLAG.findall(row)} - accepted
    assert not unknown, f"{page.name}: flag tables list flags no command of the page accepts: {sorted(unknown)}"


def test_the_command_scanner_sees_commands():
    """Guard against a scanner that silently finds nothing (the test above would then pass vacuously)."""
    seen = {(p, s) for page in PAGES for p, s, _ in _mentions(page)}
    assert {("fae", "run"), ("real-data", "enhance"), ("real-data", "validate"), ("fae", "compare")} <= seen
    run_flags = {f for page in PAGES for p, s, given in _mentions(page) if (p, s) == ("fae", "run")
                 for f in given}
    assert {"--records", "--output", "--rounds"} <= run_flags


def test_the_readme_command_table_names_every_subcommand():
    """The README's table is where a user looks for a command: every subcommand the parsers have is in it."""
    table = "\n".join(line for line in _text(ROOT / "README.md").splitlines() if line.startswith("|"))
    named = {(p, s) for p, s in _COMMAND.findall(table)}
    missing = sorted(f"{p} {s}" for p, s in _cli_flags() if (p, s) not in named)
    assert not missing, f"README.md's command table leaves out: {missing}"


# ---------------------------------------------------------------- examples

def _json_blocks(page: Path) -> list[str]:
    return re.findall(r"^\s*```json\n(.*?)^\s*```", _text(page), flags=re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_record_examples_are_valid_records(page):
    checked = 0
    for block in _json_blocks(page):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue  # a fragment (one field of a larger object), not a whole record
        if isinstance(obj, dict) and {"claim", "sentences", "evidence"} <= obj.keys():
            ClaimRecord.from_dict(obj)  # raises RecordError naming the field
            checked += 1
    if page.name == "README.md":
        assert checked == 1, "README's record example is not a JSON block"
