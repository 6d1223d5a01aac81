"""The built-in demo: `real-demo --output DIR` and `real-demo build-base --output DIR`."""

from __future__ import annotations

import argparse
import shlex

from real_fae_core.cli import run_guarded

from . import base_model, pipeline


def main(argv: list[str] | None = None) -> int:
    return run_guarded("real-demo", _main, argv)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["build-base"]:
        p = argparse.ArgumentParser(prog="real-demo build-base",
                                    description="rebuild the demo base model from scratch (seeded, CPU)")
        p.add_argument("--output", required=True, help="directory for the model, tokenizer and build_log.jsonl")
        p.add_argument("--steps", type=int, default=18000,
                       help="training steps; the final cosine phase ends here (default 18000, the shipped base)")
        p.add_argument("--schedule-steps", type=int, default=40000,
                       help="length of the first cosine, used up to --final-phase-from (default 40000)")
        p.add_argument("--final-phase-from", type=int, default=17000,
                       help="after this step the LR follows a cosine over --steps (default 17000); "
                            "-1 = one cosine over --steps")
        p.add_argument("--stop-after", type=int, help="end after this step (checkpointed: rerun to resume)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--target", type=float, default=0.97,
                       help="stop once this share of held-out full-pool answers is exact")
        args = p.parse_args(argv[1:])
        final = None if args.final_phase_from < 0 else args.final_phase_from
        info = base_model.build_base(args.output, steps=args.steps, schedule_steps=args.schedule_steps,
                          final_phase_from=final, stop_after=args.stop_after, seed=args.seed,
                          target=args.target, command=shlex.join(["real-demo", *argv]))
        print(info)
        return 0
    p = argparse.ArgumentParser(prog="real-demo", description="REAL vs standard SFT, end to end on a CPU "
                                "(`real-demo build-base --help` rebuilds the base model)")
    p.add_argument("--output", default="demo_out", help="output directory (default demo_out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", help="base model directory (default: the one shipped in real/demo/base)")
    args = p.parse_args(argv)
    pipeline.run_demo(args.output, seed=args.seed, base=args.base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
