"""Checkpoints in ``output_dir`` and the resume policy: when a relaunch resumes, starts over, or has nothing to do.

The HF Trainer resumes any checkpoint it is given: with ``max_steps`` at or
below the checkpoint's step it trains past the new limit on the old LR
schedule, and with another learning rate, batch, LoRA rank or data it silently
continues a different run. So a relaunch on the same ``output_dir``

- has nothing to do when the directory holds the finished model of the same
  run (same fingerprint, :mod:`real.training.fingerprint`): exit 0;
- resumes the newest complete checkpoint only when the fingerprint it stores
  matches the new run, or when asked to (``--resume``, ``--resume_with_changes``,
  ``--resume_from_checkpoint DIR``);
- refuses otherwise, naming each difference and the flags that decide.

Settings the checkpoint's optimizer and scheduler state would override
(learning rate, schedule, steps, batch, LoRA shapes) can only change by
starting over (``--start_over``); the others (data, seed, max_length, ...)
also with ``--resume_with_changes``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from real_fae_core.errors import UserError
from real.training.fingerprint import FINISHED_FILE, definition_differences, finished_definition, stored_definition

logger = logging.getLogger("real.train")

# Files real-train / the Trainer write at the top of output_dir (start_over removes them).
RUN_FILES = re.compile(
    r"^(checkpoint-\d+|adapter_model\.safetensors|adapter_config\.json|model(-\d+-of-\d+)?\.safetensors"
    r"|model\.safetensors\.index\.json|config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json"
    r"|chat_template\.jinja|training_args\.bin|trainer_state\.json|(train|all|eval)_results\.json"
    r"|resolved_config\.yaml|README\.md|" + re.escape(FINISHED_FILE) + r")$"
)
# A saved final model (adapter or full weights).
_WEIGHTS = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json")

# Settings a resume cannot change: the Trainer restores the checkpoint's optimizer and LR scheduler (a new
# learning rate, schedule, warm-up or max_steps is silently ignored: measured, the LR of a linear schedule stays
# at the old end), the adapter's shapes, and the data order of its batch size.
FIXED_ON_RESUME = ("model", "use_peft", "lora_r", "lora_alpha", "lora_target_modules", "learning_rate",
                   "lr_scheduler_type", "warmup_steps", "optim", "weight_decay", "global_batch_size",
                   "per_device_train_batch_size", "num_train_epochs", "max_steps")


def last_complete_checkpoint(output_dir: str) -> str | None:
    """Newest ``checkpoint-N`` whose trainer_state.json was fully written.

    A run killed while saving leaves a checkpoint without (or with a torn)
    trainer_state.json, written last by the Trainer; such a folder is skipped.
    """
    d = Path(output_dir)
    if not d.is_dir():
        return None
    cands = []
    for c in d.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", c.name)
        if m and c.is_dir():
            cands.append((int(m.group(1)), c))
    for _, c in sorted(cands, reverse=True):
        try:
            json.loads((c / "trainer_state.json").read_text())
        except (OSError, ValueError):
            logger.warning("skipping incomplete checkpoint %s", c)
            continue
        return str(c)
    return None


def checkpoint_state(checkpoint: str) -> dict:
    """The checkpoint's trainer_state.json as a mapping; an unreadable one is a :class:`UserError` saying the
    checkpoint is incomplete."""
    try:
        return json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{checkpoint}: no readable trainer_state.json ({exc}); it is not a complete checkpoint") \
            from None


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
        return step, []  # a checkpoint of an older real-train: the caller decided to accept it
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
        if RUN_FILES.match(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed


def already_trained(output_dir: str, definition: dict) -> bool:
    """``output_dir`` holds the saved final model of a run with exactly this fingerprint."""
    finished = finished_definition(output_dir)
    return (finished is not None and not definition_differences(finished, definition)
            and any((Path(output_dir) / w).is_file() for w in _WEIGHTS))


@dataclass
class Start:
    """Where a launch starts: a checkpoint to resume (and its step), from scratch, or nothing to do."""

    checkpoint: str | None = None
    step: int = 0
    finished: bool = False


def check_start_flags(script_args, training_args) -> None:
    """Flags that contradict each other, refused before anything is read or deleted."""
    if script_args.start_over:
        given = [name for name, on in (("--resume_from_checkpoint", training_args.resume_from_checkpoint),
                                       ("--resume", script_args.resume),
                                       ("--resume_with_changes", script_args.resume_with_changes)) if on]
        if given:
            raise UserError(f"--start_over and {given[0]} contradict each other; pass one of them")


def finished_start(script_args, training_args, definition: dict) -> Start | None:
    """``Start(finished=True)`` when ``output_dir`` holds this run's final model (unless a flag says otherwise)."""
    if script_args.start_over or training_args.resume_from_checkpoint:
        return None
    return Start(finished=True) if already_trained(training_args.output_dir, definition) else None


def choose_start(script_args, training_args, definition: dict) -> Start:
    """Resume, start over or train from scratch (main process only, under the output_dir lock).

    A finished run is recognised before (:func:`finished_start`), so that no tokenizer loads for it.
    """
    out = training_args.output_dir
    check_start_flags(script_args, training_args)
    if script_args.start_over:
        removed = clear_previous_run(out)
        if removed:
            logger.warning("start_over: removed %d entries of the earlier run in %s (%s)", len(removed), out,
                           ", ".join(removed[:6]) + (", ..." if len(removed) > 6 else ""))
        return Start()
    explicit = training_args.resume_from_checkpoint
    asked = bool(explicit or script_args.resume or script_args.resume_with_changes)
    checkpoint = explicit or last_complete_checkpoint(out)
    if not checkpoint:
        if script_args.resume or script_args.resume_with_changes:
            flag = "--resume" if script_args.resume else "--resume_with_changes"
            raise UserError(f"{flag}: {out} holds no complete checkpoint to resume; drop the flag to train "
                            "from scratch")
        _refuse_other_finished_run(out, definition)
        return Start()
    state = checkpoint_state(checkpoint)
    if stored_definition(state) is None and not asked:
        raise UserError(
            f"{checkpoint} stores no run fingerprint (written by an older real-train), so it cannot be matched "
            "to this run's settings; pass --resume true to continue it anyway, --start_over true to train from "
            "scratch (deletes the checkpoints in output_dir), or use a new output_dir"
        )
    step, diffs = check_resume(checkpoint, definition, max_steps=training_args.max_steps,
                               allow_changes=script_args.resume_with_changes)
    if diffs:
        logger.warning("resume_with_changes: resuming %s with changed settings: %s", checkpoint, "; ".join(diffs))
    return Start(checkpoint, step)


def _refuse_other_finished_run(output_dir: str, definition: dict) -> None:
    """Training from scratch would overwrite the finished model of a different run: say so instead."""
    finished = finished_definition(output_dir)
    diffs = definition_differences(finished, definition) if finished is not None else []
    if not diffs:
        return
    raise UserError(
        f"{output_dir} holds the finished model of a run with other settings ({'; '.join(diffs)}); "
        "pass --start_over true to replace it (deletes it), or use a new output_dir"
    )
