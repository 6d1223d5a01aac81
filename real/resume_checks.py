"""When a relaunch may resume a checkpoint, and what it says when it is stopped.

The HF Trainer resumes any checkpoint it is given: with ``max_steps`` at or
below the checkpoint's step it trains past the new limit on the old LR
schedule, and with another learning rate, batch, LoRA rank or data it silently
continues a different run. Each checkpoint therefore carries the settings that
define its run (a stateful Trainer callback, stored in ``trainer_state.json``),
and a resume is refused when they differ, naming each difference. Settings
the checkpoint's optimizer and scheduler state would override (learning rate,
schedule, steps, batch, LoRA shapes) can only change by starting over
(``start_over``); the others (data, seed, max_length, ...) also with
``resume_with_changes``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from data_prep.core.cli import set_interrupt_note
from data_prep.core.errors import UserError

CALLBACK_NAME = "RunDefinition"
# Files real-train / the Trainer write at the top of output_dir (start_over removes them).
_RUN_FILES = re.compile(
    r"^(checkpoint-\d+|adapter_model\.safetensors|adapter_config\.json|model(-\d+-of-\d+)?\.safetensors"
    r"|model\.safetensors\.index\.json|config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json"
    r"|chat_template\.jinja|training_args\.bin|trainer_state\.json|(train|all|eval)_results\.json"
    r"|resolved_config\.yaml|README\.md)$"
)


def run_definition(*, script_args, training_args, model_args, data_sha: str, global_batch: int) -> dict:
    """The settings that make two launches the same run (SPEC §4 hyper-parameters and the data)."""
    t, m = training_args, model_args
    d = {
        "model": str(m.model_name_or_path),
        "data_sha256": data_sha,
        "variant": script_args.variant,
        "max_length": t.max_length,
        "drop_overlong": bool(getattr(script_args, "drop_overlong", False)),
        "learning_rate": t.learning_rate,
        "lr_scheduler_type": str(getattr(t.lr_scheduler_type, "value", t.lr_scheduler_type)),
        "warmup_steps": t.warmup_steps,
        "optim": str(getattr(t.optim, "value", t.optim)),
        "weight_decay": t.weight_decay,
        "global_batch_size": global_batch,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "num_train_epochs": t.num_train_epochs,
        "max_steps": t.max_steps,
        "seed": t.seed,
        "use_peft": bool(m.use_peft),
    }
    if m.use_peft:
        targets = m.lora_target_modules
        d.update(lora_r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                 lora_target_modules=sorted(targets) if isinstance(targets, list) else targets)
    return json.loads(json.dumps(d, default=str))


class RunDefinition(TrainerCallback, ExportableState):
    """Stores the run definition in every checkpoint's trainer_state.json (``stateful_callbacks``)."""

    def __init__(self, settings: dict | None = None):
        self.settings = dict(settings or {})

    def state(self) -> dict:
        return {"args": {"settings": self.settings}, "attributes": {}}


class InterruptNote(TrainerCallback):
    """Keeps the Ctrl-C / SIGTERM line current: the last checkpoint saved and the command to resume."""

    def __init__(self, output_dir: str, resume_command: str, start: str | None):
        self.output_dir = output_dir
        self.resume_command = resume_command
        self.show(start)

    def show(self, checkpoint: str | None, step: int | None = None):
        if checkpoint:
            kept = f"kept checkpoint {checkpoint}" + (f" (step {step})" if step is not None else "")
            set_interrupt_note(f"{kept}; resume with: {self.resume_command}")
        else:
            set_interrupt_note(f"no checkpoint saved yet in {self.output_dir} (nothing kept); "
                               f"start again with: {self.resume_command}")

    def on_save(self, args, state, control, **kwargs):
        self.show(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), state.global_step)


def resume_command(argv: list[str]) -> str:
    """The command line to run again (same output_dir resumes)."""
    launched = "LOCAL_RANK" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ
    if launched:
        return "the same `accelerate launch ... -m real.train " + shlex.join(argv) + "` command"
    prog = "real-train" if Path(sys.argv[0]).name == "real-train" else f"{Path(sys.executable).name} -m real.train"
    return f"{prog} {shlex.join(argv)}".strip()


def checkpoint_state(checkpoint: str) -> dict:
    try:
        return json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{checkpoint}: no readable trainer_state.json ({exc}); it is not a complete checkpoint") \
            from None


def stored_definition(state: dict) -> dict | None:
    cb = (state.get("stateful_callbacks") or {}).get(CALLBACK_NAME)
    if isinstance(cb, list):
        cb = cb[0] if cb else None
    return (cb or {}).get("args", {}).get("settings") if isinstance(cb, dict) else None


# Settings a resume cannot change: the Trainer restores the checkpoint's optimizer and LR scheduler (a new
# learning rate, schedule, warm-up or max_steps is silently ignored: measured, the LR of a linear schedule stays
# at the old end), the adapter's shapes, and the data order of its batch size.
FIXED_ON_RESUME = ("model", "use_peft", "lora_r", "lora_alpha", "lora_target_modules", "learning_rate",
                   "lr_scheduler_type", "warmup_steps", "optim", "weight_decay", "global_batch_size",
                   "per_device_train_batch_size", "num_train_epochs", "max_steps")


def definition_differences(stored: dict, current: dict) -> list[str]:
    keys = [k for k in current if k in stored] + [k for k in stored if k not in current]
    return [f"{k} {stored.get(k)!r} -> {current.get(k)!r}" for k in keys if stored.get(k) != current.get(k)]


def check_resume(checkpoint: str, current: dict, *, max_steps: int, allow_changes: bool) -> tuple[int, list[str]]:
    """Refuse a resume that cannot continue the checkpoint's run; returns (step, accepted differences)."""
    state = checkpoint_state(checkpoint)
    step = int(state.get("global_step") or 0)
    if max_steps > 0 and max_steps <= step:
        raise UserError(
            f"cannot resume {checkpoint}: it is at step {step} and max_steps is {max_steps}, so nothing is left to "
            "train (the Trainer would go on past max_steps on the old learning-rate schedule); a resume cannot "
            "change max_steps either (the schedule is the checkpoint's): use a new output_dir, or pass "
            "--start_over true to train from scratch (deletes the checkpoints in output_dir)"
        )
    stored = stored_definition(state)
    if stored is None:
        return step, []  # a checkpoint of an older real-train: nothing stored to compare
    diffs = definition_differences(stored, current)
    fixed = [d for d in diffs if d.split(" ", 1)[0] in FIXED_ON_RESUME]
    if fixed:
        raise UserError(
            f"cannot resume {checkpoint}: its run was defined with other settings ({'; '.join(fixed)}), and a "
            "resume keeps the checkpoint's optimizer, learning-rate schedule and adapter shapes, so these cannot "
            "change; use a new output_dir, or pass --start_over true to train from scratch (deletes the "
            "checkpoints in output_dir)"
        )
    if diffs and not allow_changes:
        raise UserError(
            f"cannot resume {checkpoint}: its run was defined with other settings ({'; '.join(diffs)}); "
            "pass --resume_with_changes true to continue it with the new settings, --start_over true to train "
            "from scratch (deletes the checkpoints), or use a new output_dir"
        )
    return step, diffs


def clear_previous_run(output_dir: str) -> list[str]:
    """Remove the checkpoints and results of an earlier run in ``output_dir`` (``start_over``)."""
    d = Path(output_dir)
    removed = []
    if not d.is_dir():
        return removed
    for entry in sorted(d.iterdir()):
        if _RUN_FILES.match(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed
