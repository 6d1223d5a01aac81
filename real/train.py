"""``real-train``: REAL / SFT training of a verifier (TRL ``SFTTrainer`` + LoRA), driven by a recipe.

Multi-process::

    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml \\
        -m real.train --config recipes/llama-3.1-8b-instruct/real.yaml

One process: ``real-train --config recipes/tiny/llama-sft.yaml``.

Arguments are TRL's own dataclasses (``ScriptArguments``, ``SFTConfig``,
``ModelConfig``) parsed by ``TrlParser``: defaults < recipe YAML < command
line; an unknown YAML key is an error. The work is done by
:mod:`real.training`; this module only parses and calls it (docs/training.md).
"""

from __future__ import annotations

import logging

from real_fae_core.entry import run_guarded
from real_fae_core.lifeline import answer_sigterm, die_with_launcher, launched, leave, watch_peers


def main(argv: list[str] | None = None) -> int:
    """Run one training; a launched rank started from the command line (``argv`` None) ends through
    :func:`real_fae_core.lifeline.leave`, so it exits within seconds of its last step and says so."""
    die_with_launcher()  # first, before the heavy imports: a launched rank never outlives its launcher
    watch_peers("real-train")
    answer_sigterm("real-train")  # SIGTERM ends a rank with a line that says why  # nor a sibling rank that has exited
    from real.training import parse_args, train  # torch, transformers, trl: after the lifeline

    def body(argv: list[str]) -> int:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
        script_args, training_args, model_args = parse_args(argv)
        train(script_args, training_args, model_args, argv)
        return 0

    code = run_guarded("real-train", body, argv)
    if argv is None and launched():
        leave("real-train", code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
