"""Recipe and option values checked before any model loads: one line naming the key, never a traceback.

``TrlParser`` reads a recipe with ``yaml.safe_load`` (a key given twice silently
keeps the last value) and hands YAML values to argparse as *defaults*, which
argparse never type-checks unless they are strings: ``lora_r: 1.5`` or
``per_device_train_batch_size: [2]`` reach the Trainer as they are and fail deep
inside it. Here the recipe is read by the project's one strict loader
(:func:`real_fae_core.config.load_config`: keys, types, a key given twice), and
the parsed arguments (YAML and command line together) are checked against the
ranges the trainer can use; those depend on each other (LoRA ranges only with
``use_peft``), so they are a function here, not field metadata of TRL's classes.
"""

from __future__ import annotations

import math
import os
import re

from real_fae_core.config import load_config
from real_fae_core.errors import UserError


# ---------------------------------------------------------------------------
# The recipe file
# ---------------------------------------------------------------------------

def load_recipe(path: str | os.PathLike, dataclass_types) -> tuple[dict, dict[tuple, int]]:
    """(the recipe's values, each checked against its field's type, the line of every key).

    The one strict loader (:mod:`real_fae_core.config`) reads it; ``env`` (a
    mapping of environment variables) is the one key that is no field.
    """
    config, lines = load_config(path, dataclass_types, extra=("env",))
    if not isinstance(config.get("env", {}), dict):
        raise UserError(f"{path}:{lines.get(('env',), '?')}: env: must be a mapping of variable names to values")
    return config, lines


# ---------------------------------------------------------------------------
# Ranges of the parsed values (recipe and command line together)
# ---------------------------------------------------------------------------

def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def range_problems(script_args, training_args, model_args) -> list[tuple[str, str]]:
    """(key, problem) for every value outside the range the trainer can use."""
    t, m = training_args, model_args
    out: list[tuple[str, str]] = []

    def need(key, ok, what):
        if not ok:
            out.append((key, f"{what}, got {getattr(t, key, getattr(m, key, None))!r}"))

    need("learning_rate", _num(t.learning_rate) and t.learning_rate > 0, "must be a positive number")
    need("per_device_train_batch_size", t.per_device_train_batch_size >= 1, "must be at least 1")
    need("gradient_accumulation_steps", t.gradient_accumulation_steps >= 1, "must be at least 1")
    if t.global_batch_size is not None:
        need("global_batch_size", t.global_batch_size >= 1, "must be at least 1")
    need("max_steps", t.max_steps == -1 or t.max_steps >= 1,
         "must be a positive number of steps, or -1 to train num_train_epochs")
    if t.max_steps == -1:
        need("num_train_epochs", _num(t.num_train_epochs) and t.num_train_epochs > 0,
             "must be positive when max_steps is not set")
    if t.max_length is not None:
        need("max_length", t.max_length >= 1, "must be at least 1 (or null for no limit)")
    need("warmup_steps", _num(t.warmup_steps) and t.warmup_steps >= 0, "must be 0 or more")
    need("weight_decay", _num(t.weight_decay) and t.weight_decay >= 0, "must be 0 or more")
    need("seed", 0 <= t.seed < 2**32, "must be between 0 and 2**32 - 1")
    for key in ("logging_steps", "save_steps"):
        need(key, _num(getattr(t, key)) and getattr(t, key) > 0, "must be positive")
    if m.use_peft:
        need("lora_r", m.lora_r >= 1, "must be at least 1")
        need("lora_alpha", _num(m.lora_alpha) and m.lora_alpha > 0, "must be positive")
        need("lora_dropout", _num(m.lora_dropout) and 0 <= m.lora_dropout < 1, "must be in [0, 1)")
    return out


def check_ranges(script_args, training_args, model_args, *, recipe: str | None, recipe_lines: dict[tuple, int],
                 cli_keys: set[str]) -> None:
    """The first value out of range as one line: ``recipe:line: key: problem`` or ``argument --key: problem``."""
    problems = range_problems(script_args, training_args, model_args)
    if problems:
        key, problem = problems[0]
        if key in cli_keys or (key,) not in recipe_lines:
            raise UserError(f"argument --{key}: {problem}")
        raise UserError(f"{recipe}:{recipe_lines[(key,)]}: {key}: {problem}")


# ---------------------------------------------------------------------------
# LoRA target modules (PEFT semantics)
# ---------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def normalize_target_modules(value):
    """A plain module name given as a string means that module, as a one-item list does.

    PEFT reads a *string* ``target_modules`` as a regular expression that must
    match a module's full dotted name (``model.layers.0.self_attn.q_proj``), or
    the keyword ``all-linear``; TRL's ``ModelConfig`` even turns a one-item list
    into such a string. ``q_proj`` as a regular expression matches only a
    top-level module literally named ``q_proj``, which a list also matches, so
    reading a plain name as ``[name]`` keeps every PEFT meaning and fixes the
    common case. Strings with regex syntax and ``all-linear`` pass unchanged.
    """
    if isinstance(value, str) and value != "all-linear" and _PLAIN_NAME.match(value):
        return [value]
    return value


def target_module_problem(target, module_names: list[str]) -> str | None:
    """Why ``target`` selects no module of the model (PEFT's matching rules), or None."""
    if target is None or target == "all-linear":
        return None
    if isinstance(target, str):
        if any(re.fullmatch(target, n) for n in module_names):
            return None
        return (f"lora_target_modules {target!r} is a string, which PEFT reads as a regular expression that must "
                "match a module's full name (e.g. model.layers.0.self_attn.q_proj), and it matches none; "
                "give a list of module names such as [q_proj, v_proj], or all-linear")
    leaves = {n.rsplit(".", 1)[-1] for n in module_names}
    missing = [t for t in target if not any(n == t or n.endswith("." + t) for n in module_names)]
    if missing:
        linear_hint = ", ".join(sorted(x for x in leaves if x.endswith("proj"))[:12])
        hint = f" (its projection modules: {linear_hint})" if linear_hint else ""
        return f"lora_target_modules: the model has no module named {', '.join(map(repr, missing))}{hint}"
    return None


def model_module_names(name: str, *, revision: str | None = None, trust_remote_code: bool = False) -> list[str] | None:
    """Module names of ``name`` from its config alone (weights on the meta device: nothing loads)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
        with init_empty_weights():
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # an exotic architecture: PEFT will check when the model is loaded
        return None
    return [n for n, _ in skeleton.named_modules() if n]
