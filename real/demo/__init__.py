"""The built-in demo: `real-demo --output DIR` and `real-demo build-base --output DIR`."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

from real_fae_core.command import CommandConfig, CommandResult, exit_code_of
from real_fae_core.entry import run_guarded
from real_fae_core.errors import EXIT_FAILURE, EXIT_OK

from . import base_model, pipeline
from .drift import table2_pattern


def main(argv: list[str] | None = None) -> int:
    return run_guarded("real-demo", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """``real-demo [--output DIR ...]`` runs the demo; ``real-demo build-base ...`` is its one subcommand."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="real-demo",
                                description="REAL vs standard SFT, end to end on a CPU "
                                            "(`real-demo build-base --help` rebuilds the base model)")
    p.add_argument("--output", default="demo_out", help="output directory (default demo_out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", help="base model directory (default: the one shipped in real/demo/base)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    what = "rebuild the demo base model from scratch (seeded, CPU)"
    b = sub.add_parser("build-base", help=what, description=what, allow_abbrev=False)
    b.add_argument("--output", required=True, help="directory for the model, tokenizer and build_log.jsonl")
    b.add_argument("--steps", type=int, default=18000,
                   help="training steps; the final cosine phase ends here (default 18000, the shipped base)")
    b.add_argument("--schedule-steps", type=int, default=40000,
                   help="length of the first cosine, used up to --final-phase-from (default 40000)")
    b.add_argument("--final-phase-from", type=int, default=17000,
                   help="after this step the LR follows a cosine over --steps (default 17000); "
                        "-1 = one cosine over --steps")
    b.add_argument("--stop-after", type=int, help="end after this step (checkpointed: rerun to resume)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--target", type=float, default=0.97,
                   help="stop once this share of held-out full-pool answers is exact")
    # after add_subparsers, which names the subcommand from the usage: the demo runs without a COMMAND
    p.usage = ("%(prog)s [-h] [--output OUTPUT] [--seed SEED] [--base BASE]\n"
               "       %(prog)s build-base [-h] --output OUTPUT ...")
    return p


@dataclasses.dataclass
class DemoConfig(CommandConfig):
    """`real-demo`: the whole demo into ``output`` (a fresh run every time)."""

    output: str = "demo_out"
    seed: int = 0
    base: str | None = None


CONFIG = DemoConfig


def run(config: DemoConfig) -> CommandResult:
    """The demo as a function; ``summary`` is its summary.json. It fails (exit 1) when the Table-2 pattern it
    exists to show did not hold: numbers that contradict the demo's own claims must not exit 0."""
    summary = pipeline.run_demo(config.output, seed=config.seed, base=config.base)
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
        return exit_code_of(base_model.run(config, command=shlex.join(["real-demo", *argv])))
    return exit_code_of(run(DemoConfig.from_namespace(args)))


if __name__ == "__main__":
    raise SystemExit(main())
