"""Every command of the five tools with a dialect of their own, as their entry points build them: the walk
behind tests/test_commands.py, tests/test_cli_dialect.py and docs/architecture.md's command table
(tests/test_docs_commands.py). It imports real's commands (real-demo, real-merge, real-import-gguf), so it is
named among the files that may import the trainer (tests/test_architecture.py)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Walked(NamedTuple):
    """One command of the walk: the module that runs it, its config class (None: no typed command), its parser."""

    module: Any
    config: type | None
    parser: Any


def command_parsers() -> dict[str, Walked]:
    """{prog: :class:`Walked`} of every command and subcommand of the five tools with a flag dialect of their
    own (real-data, fae, real-demo, real-merge, real-import-gguf), built as their entry points build them: a
    subcommand's config is the one its registry entry names (``"module:XConfig"``, real_fae_core.cli), a
    console script's its module's ``CONFIG``. ``real-train`` keeps TRL's parser and is not here."""
    import argparse

    import data_prep.cli
    import fae.cli
    from real import demo, gguf_import, merge
    from real.demo import base_model
    from real_fae_core.cli import build_parser
    from real_fae_core.command import config_type

    def subparsers(parser) -> dict:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    out = {}
    for prog, mod in (("real-data", data_prep.cli), ("fae", fae.cli)):
        top, commands = build_parser(prog, mod.__doc__, mod.SUBCOMMANDS)
        for name, command in commands.items():
            out[f"{prog} {name}"] = Walked(command.module, command.config, subparsers(top)[name])
    top = demo.build_parser()
    out["real-demo"] = Walked(demo, config_type(demo), top)
    out["real-demo build-base"] = Walked(base_model, config_type(base_model), subparsers(top)["build-base"])
    out["real-merge"] = Walked(merge, config_type(merge), merge.build_parser())
    out["real-import-gguf"] = Walked(gguf_import, config_type(gguf_import), gguf_import.build_parser())
    return out


def every_parser() -> dict:
    """{name: parser} of every parser a console script builds: the commands of :func:`command_parsers`, the
    top-level dispatchers of real-data and fae (their ``--debug``), the subparsers of each, and real-train's
    TRL parser, so a rule about parsing (no abbreviated flags) is checked on all of them."""
    import argparse

    import data_prep.cli
    import fae.cli
    from real.training.args import make_parser as real_train_parser
    from real_fae_core.cli import build_parser

    out = {prog: walked.parser for prog, walked in command_parsers().items()}
    for prog, mod in (("real-data", data_prep.cli), ("fae", fae.cli)):
        out[prog] = build_parser(prog, mod.__doc__, mod.SUBCOMMANDS)[0]
    out["real-train"] = real_train_parser()
    todo = list(out.items())
    while todo:
        name, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    key = f"{name} {sub_name} (subparser)"
                    out[key] = sub
                    todo.append((key, sub))
    return out


COMMAND_TABLE_START = "<!-- commands: generated from the parsers by tests/test_docs_commands.py; do not edit -->"
COMMAND_TABLE_END = "<!-- end of commands -->"


def command_table() -> str:
    """The Markdown table of every command (its module, config class and one-line help), from the parsers."""
    import data_prep.cli
    import fae.cli

    helps = {f"{prog} {name}": text for prog, table in (("fae", fae.cli.SUBCOMMANDS),
                                                        ("real-data", data_prep.cli.SUBCOMMANDS))
             for name, (_module, text) in table.items()}
    rows = ["| Command | Module | Config (`run(config) -> CommandResult`) | What it does |",
            "|---|---|---|---|"]
    for prog, (module, cls, parser) in sorted(command_parsers().items()):
        config = f"`{cls.__name__}`" if cls is not None else "(none)"
        what = " ".join((helps.get(prog) or parser.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{prog}` | `{module.__name__}` | {config} | {what} |")
    return "\n".join([COMMAND_TABLE_START, *rows, COMMAND_TABLE_END])
