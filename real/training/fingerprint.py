"""The run fingerprint: the settings that make two launches the same training run, and where they are stored.

A fingerprint is the base model, the sha256 of the pairs data and the recipe's
hyper-parameters (SPEC §4). Every checkpoint carries it in its
``trainer_state.json`` (a stateful Trainer callback, ``stateful_callbacks.RunDefinition``),
and a finished run leaves it in ``output_dir/run_fingerprint.json``, written
last, so its presence means the final model was saved completely. The resume
policy (:mod:`real.training.checkpoints`) compares them with the new launch.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.hashing import sha256_json

CALLBACK_NAME = "RunDefinition"
FINISHED_FILE = "run_fingerprint.json"


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
    if getattr(script_args, "trainer", "sft") != "sft":  # the on-policy objective's own settings
        d.update(trainer=script_args.trainer, init_adapter=script_args.init_adapter,
                 records=script_args.records, num_generations=t.num_generations,
                 max_completion_length=t.max_completion_length, temperature=t.temperature, beta=t.beta,
                 reward_weights=list(t.reward_weights or []), control_seed=t.control_seed,
                 seeded_sampling=t.seeded_sampling)
    if m.use_peft:
        targets = m.lora_target_modules
        d.update(lora_r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                 lora_target_modules=sorted(targets) if isinstance(targets, list) else targets)
    return json.loads(json.dumps(d, default=str))


def definition_differences(stored: dict, current: dict) -> list[str]:
    """``"key old -> new"`` for every setting that differs (stored order first, then keys only one side has)."""
    keys = [k for k in current if k in stored] + [k for k in stored if k not in current]
    return [f"{k} {stored.get(k)!r} -> {current.get(k)!r}" for k in keys if stored.get(k) != current.get(k)]


class RunDefinition(TrainerCallback, ExportableState):
    """Stores the run definition in every checkpoint's trainer_state.json (``stateful_callbacks``)."""

    def __init__(self, settings: dict | None = None):
        self.settings = dict(settings or {})

    def state(self) -> dict:
        """The run definition as a stateful callback's state, so it is stored in every checkpoint."""
        return {"args": {"settings": self.settings}, "attributes": {}}


def stored_definition(state: dict) -> dict | None:
    """The definition a checkpoint's trainer_state.json carries; None for checkpoints of an older real-train."""
    cb = (state.get("stateful_callbacks") or {}).get(CALLBACK_NAME)
    if isinstance(cb, list):
        cb = cb[0] if cb else None
    settings = (cb or {}).get("args", {}).get("settings") if isinstance(cb, dict) else None
    return settings if isinstance(settings, dict) else None


def write_finished(output_dir: str | Path, definition: dict) -> Path:
    """Mark ``output_dir`` as holding the finished model of this run (call after everything else is saved)."""
    path = Path(output_dir) / FINISHED_FILE
    record = {"fingerprint": sha256_json(definition), "definition": definition}
    atomic_write_json(path, record, sort_keys=True)
    return path


def finished_definition(output_dir: str | Path) -> dict | None:
    """The definition of the run whose final model ``output_dir`` holds, or None (unfinished, unreadable, none)."""
    try:
        record = json.loads((Path(output_dir) / FINISHED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    definition = record.get("definition") if isinstance(record, dict) else None
    return definition if isinstance(definition, dict) else None
