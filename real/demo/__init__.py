"""The built-in demo: `real-demo --output DIR` and `real-demo build-base --output DIR`."""

from __future__ import annotations

import argparse
import dataclasses

from real_fae_core.command import (CommandConfig, CommandResult, add_config_arguments, exit_code_of,
                                   given_command_line, option)
from real_fae_core.entry import run_guarded
from real_fae_core.errors import EXIT_FAILURE, EXIT_OK

from . import base_model, pipeline
from .drift import table2_pattern


@dataclasses.dataclass
class DemoConfig(CommandConfig):
    """`real-demo`: the whole demo into ``output`` (a fresh run every time)."""

    output: str = option("demo_out", help="output directory (default demo_out)")
    seed: int = 0
    base: str | None = option(None, help="base model directory (default: the one shipped in real/demo/base)")
    on_policy: bool = option(False, help="also train the on-policy variant (GRPO from real_sufficient's adapter, "
                                         "rewarded by its own ablations; recipes/demo/on_policy.yaml) and report "
                                         "it beside the others (docs/demo.md: its cost)")


CONFIG = DemoConfig


def main(argv: list[str] | None = None) -> int:
    """`real-demo [build-base] ...`: run the demo (or build its base model); the exit code, every failure as
    one line."""
    return run_guarded("real-demo", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """``real-demo [--output DIR ...]`` runs the demo; ``real-demo build-base ...`` is its one subcommand."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="real-demo",
                                description="REAL vs standard SFT, end to end on a CPU "
                                            "(`real-demo build-base --help` rebuilds the base model)")
    add_config_arguments(p, DemoConfig)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    what = "rebuild the demo base model from scratch (seeded, CPU)"
    b = sub.add_parser("build-base", help=what, description=what, allow_abbrev=False)
    add_config_arguments(b, base_model.BuildBaseConfig)
    # after add_subparsers, which names the subcommand from the usage: the demo runs without a COMMAND
    p.usage = ("%(prog)s [-h] [--output OUTPUT] [--seed SEED] [--base BASE] [--on-policy]\n"
               "       %(prog)s build-base [-h] --output OUTPUT ...")
    return p


def run(config: DemoConfig) -> CommandResult:
    """The demo as a function; ``summary`` is its summary.json. It fails (exit 1) when the Table-2 pattern it
    exists to show did not hold: numbers that contradict the demo's own claims must not exit 0."""
    size = pipeline.DemoSize(on_policy=config.on_policy)
    summary = pipeline.run_demo(config.output, size=size, seed=config.seed, base=config.base)
    held = all(ok for _, ok in table2_pattern(summary))
    return CommandResult(exit_code=EXIT_OK if held else EXIT_FAILURE, outputs={"output": str(config.output)},
                         summary=summary)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "build-base" and argv[:1] != ["build-base"]:  # the demo's flags would be dropped silently
        parser.error("build-base comes first: real-demo build-base --output DIR ...")
    if args.command == "build-base":
        config = base_model.BuildBaseConfig.from_namespace(args)
        return exit_code_of(base_model.run(config, command=given_command_line("real-demo", argv)))
    return exit_code_of(run(DemoConfig.from_namespace(args)))


if __name__ == "__main__":
    raise SystemExit(main())
