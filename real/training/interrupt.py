"""What an interrupted real-train says: the last checkpoint kept and the command that resumes it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from transformers import TrainerCallback

from real.training.checkpoints import last_complete_checkpoint
from real_fae_core.entry import set_interrupt_note
from real_fae_core.lifeline import launched
from real_fae_core.command import given_command_line


class InterruptNote(TrainerCallback):
    """Keeps the Ctrl-C / SIGTERM line current: the last checkpoint saved and the command to resume."""

    def __init__(self, output_dir: str, resume_command: str, start: str | None):
        self.output_dir = output_dir
        self.resume_command = resume_command
        self.show(start)

    def show(self, checkpoint: str | None, step: int | None = None):
        """Make the Ctrl-C / SIGTERM line name ``checkpoint`` (at ``step``); None: say no checkpoint is kept yet."""
        # before the first on_save the line is said when the signal lands: a first checkpoint may be complete
        # on disk before on_save reports it
        set_interrupt_note(self.line(checkpoint, step) if checkpoint else self.before_first_save)

    def line(self, checkpoint: str | None, step: int | None = None) -> str:
        """The line an interrupted run ends with: the checkpoint kept and the command that resumes it, or that
        nothing is kept and the command that starts again."""
        if checkpoint:
            kept = f"kept checkpoint {checkpoint}" + (f" (step {step})" if step is not None else "")
            return f"{kept}; resume with: {self.resume_command}"
        return f"no checkpoint saved yet in {self.output_dir} (nothing kept); start again with: {self.resume_command}"

    def before_first_save(self) -> str:
        """The newest complete checkpoint on disk (its trainer_state.json is written last), else nothing."""
        found = last_complete_checkpoint(self.output_dir)
        return self.line(found, int(Path(found).name.rsplit("-", 1)[1]) if found else None)

    def on_save(self, args, state, control, **kwargs):
        """A checkpoint was saved: the interrupt line names it from now on."""
        self.show(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), state.global_step)


def resume_command(argv: list[str]) -> str:
    """The command line to run again (same output_dir and settings: the checkpoint's fingerprint matches); a
    secret typed on it (a registered key, ``api_key=...``) is masked: the line is printed and may reach a log."""
    words = given_command_line("", argv)
    if launched():
        return "the same `accelerate launch ... -m real.train " + words + "` command"
    prog = "real-train" if Path(sys.argv[0]).name == "real-train" else f"{Path(sys.executable).name} -m real.train"
    return f"{prog} {words}".strip()
