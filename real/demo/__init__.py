"""The built-in demo: `real-demo --output DIR` and `real-demo build-base --output DIR`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    from data_prep.core.cli import run_guarded

    return run_guarded("real-demo", _main, argv)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["build-base"]:
        p = argparse.ArgumentParser(prog="real-demo build-base",
                                    description="rebuild the demo base model from scratch (seeded, CPU)")
        p.add_argument("--output", required=True, help="directory for the model, tokenizer and build_log.jsonl")
        p.add_argument("--steps", type=int, default=40000, help="maximum training steps (cosine schedule length)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--target", type=float, default=0.97,
                       help="stop once this share of held-out full-pool answers is exact")
        args = p.parse_args(argv[1:])
        from .base_model import build_base

        info = build_base(args.output, steps=args.steps, seed=args.seed, target=args.target)
        print(info)
        return 0
    p = argparse.ArgumentParser(prog="real-demo", description="REAL vs standard SFT, end to end on a CPU "
                                "(`real-demo build-base --help` rebuilds the base model)")
    p.add_argument("--output", default="demo_out", help="output directory (default demo_out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", help="base model directory (default: the one shipped in real/demo/base)")
    args = p.parse_args(argv)
    from .pipeline import run_demo

    run_demo(args.output, seed=args.seed, base=args.base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
