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

from trl import GRPOConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser

from real_fae_core.errors import UserError
from real_fae_core.flags import KeyValueFlag, appending_lists
from real_fae_core.hardware import native_bf16_cpu_flags  # noqa: F401 - also imported from here by tests
from real_fae_core.progress import show_progress
from data_prep.pairs.build import VARIANTS
from real.training import recipe_checks
from real.training.onpolicy import check_weights

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
    trainer: str = field(
        default="sft",
        metadata={"help": "How the verifier learns: `sft` (TRL's SFTTrainer on the pairs' target answers) or `grpo` "
                  "(on-policy evidence ablation, SPEC §4: TRL's GRPOTrainer samples answers to the pairs' prompts "
                  "and rewards them with the verifier's own ablations, real.training.onpolicy; needs `records`). "
                  "Decides which training options exist (GRPOConfig's with grpo).",
                  "choices": ["sft", "grpo"]},
    )
    records: str | None = field(
        default=None,
        metadata={"help": "trainer grpo: the claim records (.jsonl) the pairs were built from; the reward renders "
                  "each answer's ablated pools from their sentences."},
    )
    init_adapter: str | None = field(
        default=None,
        metadata={"help": "Start from this LoRA adapter (a real-train output, e.g. the sft or real_sufficient "
                  "model) and train it further, instead of a new adapter from the recipe's lora_* settings."},
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
class _CpuPrecision:
    """The CPU options both trainers share; their one precision rule (:meth:`_cpu_precision`)."""

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

    def _progress_default(self):
        # Trainer's step bar only on a terminal (real_fae_core.progress), unless the recipe or the command
        # line sets disable_tqdm; transformers' own default follows the logging level instead.
        if self.disable_tqdm is None:
            self.disable_tqdm = not show_progress()

    def _cpu_precision(self):
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


@dataclass
class RealSFTConfig(_CpuPrecision, SFTConfig):
    def __post_init__(self):
        self._cpu_precision()
        self._progress_default()
        super().__post_init__()


@dataclass
class RealGRPOConfig(_CpuPrecision, GRPOConfig):
    """GRPOConfig plus the options of the on-policy reward (real.training.onpolicy). ``reward_weights``
    (TRL's) weigh the terms format, label, necessity, sufficiency, control, precision, in that order."""

    max_length: int | None = field(
        default=1024,
        metadata={"help": "Longest prompt plus its target answer, in tokens: longer rows are refused "
                  "(drop_overlong: dropped), as in SFT."},
    )
    judge_batch_size: int = field(
        default=32,
        metadata={"help": "Pools per forward when the reward asks the current policy for its label on an "
                  "answer's ablated pools."},
    )
    seeded_sampling: bool = field(
        default=False,
        metadata={"help": "Draw each prompt's answers from a seed named by (seed, step, prompt), one generate "
                  "call per prompt: the answers no longer depend on the batch or on the process that draws "
                  "them, so a DDP run trains as one process does (fp32 summation aside)."},
    )
    control_seed: int = field(
        default=0,
        metadata={"help": "Seed of the control's draws (per record and citation, as FAE's matched control)."},
    )

    def __post_init__(self):
        self._cpu_precision()
        self._progress_default()
        self.reward_weights = list(check_weights(self.reward_weights))
        super().__post_init__()


DATACLASSES = (RealScriptArguments, RealSFTConfig, ModelConfig)
GRPO_DATACLASSES = (RealScriptArguments, RealGRPOConfig, ModelConfig)
TRAINERS = {"sft": DATACLASSES, "grpo": GRPO_DATACLASSES}


def trainer_kind(argv: list[str], recipe: str | None) -> str:
    """The ``trainer`` a launch asks for (command line over recipe, default sft), read before parsing:
    it decides which options exist."""
    kind = None
    for i, a in enumerate(argv):
        if a == "--trainer" and i + 1 < len(argv):
            kind = argv[i + 1]
        elif a.startswith("--trainer="):
            kind = a.split("=", 1)[1]
    if kind is None and recipe:
        import yaml

        try:
            data = yaml.safe_load(Path(recipe).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            data = None  # the strict loader says what is wrong
        if isinstance(data, dict) and isinstance(data.get("trainer"), str):
            kind = data["trainer"]
    kind = kind or "sft"
    if kind not in TRAINERS:
        raise UserError(f"trainer {kind!r}: choose {' or '.join(TRAINERS)}")
    return kind


def make_parser(dataclasses=DATACLASSES):
    """The `real-train` parser of ``dataclasses`` (a TrlParser): a list flag given twice appends, and a
    parse error is one :class:`UserError` line instead of the whole usage."""
    # a list flag given twice appends (--lora-target-modules q_proj --lora-target-modules v_proj), as on
    # every command, and given once replaces the recipe's list; transformers' options of one string that
    # stands for several (--deepspeed JSON, --report-to a,b) are refused given twice
    parser = appending_lists(TrlParser(dataclasses, prog="real-train", allow_abbrev=False), dataclasses)

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
    recipe, recipe_lines, rest = None, {}, argv
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise UserError("--config needs a recipe path")
        recipe, rest = argv[i + 1], argv[:i] + argv[i + 2:]
        if "--config" in rest:
            raise UserError("--config is given twice; pass one recipe and override values with --name value")
    dataclasses = TRAINERS[trainer_kind(rest, recipe)]
    parser = make_parser(dataclasses)
    if recipe is not None:
        config, recipe_lines = recipe_checks.load_recipe(recipe, dataclasses)
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
