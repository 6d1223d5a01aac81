"""docs/architecture.md's command table is generated from the parsers: it names every command, the module
that runs it and its config class, and cannot drift from them. Rewrite it with
``python tests/test_docs_commands.py --write``."""

from __future__ import annotations

import re
import sys
import tomllib

from command_walk import COMMAND_TABLE_END, COMMAND_TABLE_START, command_parsers, command_table
from helpers import REPO

ARCH = REPO / "docs" / "architecture.md"


def _written_table() -> str:
    text = ARCH.read_text(encoding="utf-8")
    m = re.search(re.escape(COMMAND_TABLE_START) + r".*?" + re.escape(COMMAND_TABLE_END), text, flags=re.S)
    assert m, f"{ARCH}: no generated command table (run: python tests/test_docs_commands.py --write)"
    return m.group(0)


def test_the_architecture_command_table_is_the_parsers():
    assert _written_table() == command_table(), \
        "docs/architecture.md's command table is stale: run python tests/test_docs_commands.py --write"


def test_the_table_names_every_command_and_console_script():
    table = _written_table()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    for name in scripts:
        if name != "real-train":  # TRL's parser (docs/training.md)
            assert f"`{name}" in table, f"{name} is not in docs/architecture.md's command table"
    for prog in command_parsers():
        assert f"| `{prog}` |" in table
    assert "real-train" in ARCH.read_text(encoding="utf-8")


def write() -> None:
    text = ARCH.read_text(encoding="utf-8")
    pattern = re.escape(COMMAND_TABLE_START) + r".*?" + re.escape(COMMAND_TABLE_END)
    if re.search(pattern, text, flags=re.S):
        text = re.sub(pattern, lambda _m: command_table(), text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n## Commands\n\n" + command_table() + "\n"
    ARCH.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
