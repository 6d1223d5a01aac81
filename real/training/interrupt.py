"""What an interrupted real-train says: the last checkpoint kept and the command that resumes it."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from transformers import TrainerCallback

from real_fae_core.entry import set_interrupt_note
from real_fae_core.lifeline import launched


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
        else:  # said when the signal lands: a first checkpoint may be complete before on_save reports it
            set_interrupt_note(self.before_first_save)

    def before_first_save(self) -> str:
        """The newest complete checkpoint on disk (its trainer_state.json is written last), else nothing."""
        done = []
        for state in Path(self.output_dir).glob("checkpoint-*/trainer_state.json"):
            try:
                done.append((json.loads(state.read_text()).get("global_step", 0), state.parent))
            except (OSError, ValueError):  # being written as the signal lands: not complete
                continue
        if done:
            step, path = max(done)
            return f"kept checkpoint {path} (step {step}); resume with: {self.resume_command}"
        return f"no checkpoint saved yet in {self.output_dir} (nothing kept); start again with: {self.resume_command}"

    def on_save(self, args, state, control, **kwargs):
        self.show(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), state.global_step)


def resume_command(argv: list[str]) -> str:
    """The command line to run again (same output_dir and settings: the checkpoint's fingerprint matches)."""
    if launched():
        return "the same `accelerate launch ... -m real.train " + shlex.join(argv) + "` command"
    prog = "real-train" if Path(sys.argv[0]).name == "real-train" else f"{Path(sys.executable).name} -m real.train"
    return f"{prog} {shlex.join(argv)}".strip()
