"""real-train's arguments: TRL's own dataclasses, parsed defaults < recipe YAML < command line.

Subclasses of ``ScriptArguments`` / ``SFTConfig`` only add fields, so every
TRL and transformers option keeps its name and meaning. The recipe is read
strictly (:mod:`real_fae_core.config`, through :mod:`real.training.recipe_checks`)
instead of by ``TrlParser``, whose ``yaml.safe_load`` keeps the last of two
equal keys and never type-checks YAML values; ``TrlParser`` still turns the
dataclasses into flags and takes the checked values as its defaults.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

from real_fae_core.errors import UserError
from real_fae_core.flags import KeyValueFlag, appending_lists
from real_fae_core.hardware import native_bf16_cpu_flags  # noqa: F401 - also imported from here by tests
from data_prep.pairs.build import VARIANTS
from real.training import recipe_checks

logger = logging.getLogger("real.train")

# The variants `real-data pairs` builds: a recipe's `variant` must name one (one list, in data_prep).
VARIANT_NAMES = tuple(VARIANTS)


def accelerator_available() -> bool:
    """A CUDA or XPU device is present (else training runs on CPU in fp32)."""
    import torch

    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


@dataclass
class RealScriptArguments(ScriptArguments):
    variant: str | None = field(
        default=None,
        metadata={
            "help": "Training variant the recipe is for (one of the pairs variants, SPEC §4); must match the `variant` column of the pairs dataset. Also "
            "written to the model card.",
            "choices": list(VARIANT_NAMES),
        },
    )
    drop_overlong: bool = field(
        default=False,
        metadata={"help": "Train without the pairs longer than max_length tokens (counted in the model card) "
                  "instead of refusing the dataset. TRL would otherwise truncate them and silently drop those "
                  "whose answer is cut off."},
    )
    resume: bool = field(
        default=False,
        metadata={"help": "Continue the last complete checkpoint in output_dir (refused if there is none), even one "
                  "written by an older real-train that stores no run fingerprint. Without it, a checkpoint is "
                  "resumed only when its stored fingerprint matches the new run."},
    )
    start_over: bool = field(
        default=False,
        metadata={"help": "Do not resume: delete the checkpoints and results of the earlier run in output_dir "
                  "and train from step 0 (also retrains a finished run)."},
    )
    resume_with_changes: bool = field(
        default=False,
        metadata={"help": "Resume the last checkpoint even though its data, variant, seed, max_length, "
                  "drop_overlong or lora_dropout differ from the new settings. (Model, learning rate, schedule, "
                  "batch, epochs/max_steps and LoRA shapes cannot change on resume: use start_over.)"},
    )

    fae_eval_records: str | None = field(
        default=None,
        metadata={"help": "Claim records (.jsonl) to run a small FAE on at every checkpoint save; fae/acc, fae/is, "
                  "fae/er ... are logged like the loss (trainer_state.json, report_to). Off when unset."},
    )
    fae_eval: dict | str | None = field(
        default=None,
        metadata={"help": "`fae run` options of the FAE at each save, spelled as `fae run` spells them: "
                  "limit (default 20), rounds (2), max_new_tokens (64), batch_size (8), constrained_decoding, "
                  "label_probs (false). A mapping in YAML, KEY=VALUE,... on the command line; checked against "
                  "`fae run`'s options (real.training.fae_callback.EVAL_OPTIONS). Given again on the command "
                  "line, its pairs are added (a KEY given twice with two values is an error).",
                  "action": KeyValueFlag},
    )
    # Deprecated spellings of fae_eval's keys, accepted until 0.2 with a warning (real.training.fae_callback).
    fae_eval_limit: int | None = field(default=None, metadata={"help": "deprecated: fae_eval: {limit: N}"})
    fae_eval_rounds: int | None = field(default=None, metadata={"help": "deprecated: fae_eval: {rounds: R}"})
    fae_eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "deprecated: fae_eval: {max_new_tokens: T}"})
    fae_eval_constrained_decoding: bool | None = field(
        default=None, metadata={"help": "deprecated: fae_eval: {constrained_decoding: true}"})


@dataclass
class RealSFTConfig(SFTConfig):
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Target global batch (per_device_train_batch_size x gradient_accumulation_steps x processes). "
            "When set, gradient_accumulation_steps is derived from it at launch; it must divide evenly."
        },
    )

    cpu_bf16: bool = field(
        default=False,
        metadata={"help": "Without a GPU, train with bf16 autocast (weights and optimizer stay fp32) instead of "
                  "plain fp32. Only for CPUs with native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo); "
                  "refused elsewhere, where bf16 matmuls are emulated and far slower. Ignored on a GPU."},
    )

    cpu_scored_positions: str = field(
        default="labelled",
        metadata={"help": "On a CPU, which positions TRL's fused LM head projects onto the vocabulary: `labelled` "
                  "(only the answer tokens that carry the loss; the same loss, about a third less work per step) or "
                  "`all` (TRL's own choice off CUDA: every position, masked afterwards). Ignored on a GPU.",
                  "choices": ["labelled", "all"]},
    )

    def __post_init__(self):
        # TRL turns bf16 on by default; without a GPU TrainingArguments refuses it, and bf16
        # matmuls on a CPU without native bf16 are ~100x slower. Fall back to fp32 on CPU
        # unless cpu_bf16 asks for autocast on a CPU that has native bf16.
        if not accelerator_available() and self.cpu_bf16:
            flags = native_bf16_cpu_flags()
            if not flags:
                raise UserError("cpu_bf16: this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in "
                                "/proc/cpuinfo); bf16 would be emulated and far slower than fp32: drop cpu_bf16")
            logger.warning("no GPU found: training on CPU with bf16 autocast (native %s)", "/".join(flags))
            self.bf16, self.fp16, self.use_cpu = True, False, True
        elif not accelerator_available() and (self.bf16 is None or self.bf16 or not self.use_cpu):
            if self.bf16 or self.bf16 is None:
                logger.warning("no GPU found: training on CPU in fp32 (bf16=False, use_cpu=True)")
            self.bf16 = False
            self.fp16 = False
            self.use_cpu = True
        super().__post_init__()


DATACLASSES = (RealScriptArguments, RealSFTConfig, ModelConfig)


def make_parser():
    # a list flag given twice appends (--lora-target-modules q_proj --lora-target-modules v_proj), as on
    # every command, and given once replaces the recipe's list; transformers' options of one string that
    # stands for several (--deepspeed JSON, --report-to a,b) are refused given twice
    parser = appending_lists(TrlParser(DATACLASSES, prog="real-train", allow_abbrev=False), DATACLASSES)

    def error(message: str):  # argparse would print the whole (huge) usage first
        raise UserError(message)

    parser.error = error
    return parser


def parse_args(argv: list[str] | None = None):
    """(script_args, training_args, model_args); defaults < YAML < CLI.

    The recipe's values become the parser's defaults exactly as
    ``TrlParser.parse_args_and_config`` does; its ``env`` mapping is exported.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    recipe, recipe_lines, rest = None, {}, argv
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise UserError("--config needs a recipe path")
        recipe, rest = argv[i + 1], argv[:i] + argv[i + 2:]
        if "--config" in rest:
            raise UserError("--config is given twice; pass one recipe and override values with --name value")
        config, recipe_lines = recipe_checks.load_recipe(recipe, DATACLASSES)
        for key, value in (config.pop("env", None) or {}).items():
            os.environ[str(key)] = str(value)
        parser.set_defaults_with_config(**config)
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=rest)
    except ValueError as exc:  # dataclass __post_init__ checks (e.g. fp16 and bf16 together), unused arguments
        raise UserError(str(exc).splitlines()[0]) from None
    model_args.lora_target_modules = recipe_checks.normalize_target_modules(model_args.lora_target_modules)
    cli_keys = {a[2:].split("=", 1)[0].replace("-", "_") for a in rest if a.startswith("--")}
    recipe_checks.check_ranges(script_args, training_args, model_args, recipe=recipe, recipe_lines=recipe_lines,
                               cli_keys=cli_keys)
    return script_args, training_args, model_args
