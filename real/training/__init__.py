"""The training library behind ``real-train``: TRL ``SFTTrainer`` + LoRA, driven by a recipe.

One job per module:

- ``args``: the argument dataclasses (TRL's, with a few added fields) and their parsing;
- ``recipe_checks``: recipe YAML and argument values checked before anything loads;
- ``data``: the pairs dataset of ``real-data pairs``, its variant and its sha256;
- ``pair_lengths``: pair lengths against ``max_length``, measured as TRL tokenizes;
- ``model``: base model and tokenizer loading, LoRA targets, pad / end-of-turn tokens;
- ``engines``: the distributed engine of the launch (DDP, DeepSpeed ZeRO, FSDP): its checks, FSDP on CPU
  ranks, per-rank memory;
- ``fingerprint``: the settings that define a run, stored in checkpoints and in a finished output;
- ``checkpoints``: checkpoint discovery and the resume policy;
- ``interrupt``: the Ctrl-C / SIGTERM line (last checkpoint kept, command to resume);
- ``model_card``: the output's README.md and resolved_config.yaml;
- ``trainer``: one run put together (plan, resume decision, SFTTrainer, saved outputs);
- ``fae_callback``: FAE on a dev subset at each checkpoint save, logged like the loss.

The names below are the public entry points; ``real.train`` is the command.
"""

from real.training.args import (
    DATACLASSES,
    VARIANT_NAMES,
    RealScriptArguments,
    RealSFTConfig,
    accelerator_available,
    parse_args,
)
from real.training.checkpoints import choose_start, last_complete_checkpoint
from real.training.data import check_variant, data_fingerprint, load_pairs
from real.training.fae_callback import FaeEvalCallback
from real.training.model import ensure_pad_token, set_generation_eos
from real.training.trainer import Run, build_trainer, derive_accumulation, plan_run, train

__all__ = [
    "DATACLASSES", "VARIANT_NAMES", "FaeEvalCallback", "RealSFTConfig", "RealScriptArguments", "Run", "accelerator_available",
    "build_trainer", "check_variant", "choose_start", "data_fingerprint", "derive_accumulation", "ensure_pad_token",
    "last_complete_checkpoint", "load_pairs", "parse_args", "plan_run", "set_generation_eos", "train",
]
