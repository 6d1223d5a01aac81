"""Recipe and option values checked before any model loads: one line naming the key, never a traceback.

``TrlParser`` reads a recipe with ``yaml.safe_load`` (a key given twice silently
keeps the last value) and hands YAML values to argparse as *defaults*, which
argparse never type-checks unless they are strings: ``lora_r: 1.5`` or
``per_device_train_batch_size: [2]`` reach the Trainer as they are and fail deep
inside it. Here the recipe is read strictly (:func:`real_fae_core.yamlio.load_yaml`),
every value is checked against its dataclass field type, and the parsed
arguments (YAML and command line together) against their ranges.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import re
import types
import typing
from pathlib import Path

import yaml

from real_fae_core.errors import UserError
from real_fae_core.yamlio import load_yaml

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list", dict: "a mapping"}


# ---------------------------------------------------------------------------
# The recipe file
# ---------------------------------------------------------------------------

def known_keys(dataclass_types) -> set[str]:
    keys = {"env"}
    for dc in dataclass_types:
        keys |= {f.name for f in dataclasses.fields(dc) if f.init}
    return keys


def key_lines(text: str) -> dict[str, int]:
    """Line (1-based) of each top-level key, for messages."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _field_types(dataclass_types) -> dict[str, object]:
    out = {}
    for dc in dataclass_types:
        hints = typing.get_type_hints(dc)
        for f in dataclasses.fields(dc):
            if f.init:
                out[f.name] = hints.get(f.name, f.type)
    return out


def _allowed(tp) -> list:
    """The plain types a field annotation admits (Union / Optional flattened)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _allowed(arg)]
    if tp is type(None):
        return [None]
    if origin is typing.Literal:
        return [("literal", typing.get_args(tp))]
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return [(list, args[0] if args else typing.Any)]
    if origin is dict or tp is dict:
        return [dict]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [str]
    return [tp]


def _value_error(value, tp) -> tuple[str | None, object]:
    """(problem or None, value converted where YAML gave an equivalent form)."""
    allowed = _allowed(tp)
    if typing.Any in allowed or object in allowed:
        return None, value
    if value is None:
        return (None, value) if None in allowed else ("must not be empty (null)", value)
    literals = [a[1] for a in allowed if isinstance(a, tuple) and a[0] == "literal"]
    if literals and value in literals[0]:
        return None, value
    if isinstance(value, bool):
        if bool in allowed:
            return None, value
    elif isinstance(value, int):
        if int in allowed or float in allowed:
            return None, value
    elif isinstance(value, float):
        if float in allowed:
            return None, value
        if int in allowed and math.isfinite(value) and value.is_integer():
            return None, int(value)  # `2.0` means 2
        if int in allowed:
            return f"must be a whole number, got {value!r}", value
    elif isinstance(value, str):
        if literals:
            return f"must be one of {', '.join(map(str, literals[0]))}, got {value!r}", value
        if str not in allowed and (int in allowed or float in allowed):
            # YAML 1.1 reads `1e-4` as a string; argparse would convert it, but name no file
            try:
                number = float(value)
            except ValueError:
                return f"must be {_describe(tp)}, got {value!r}", value
            return _value_error(number, tp)
        return None, value
    elif isinstance(value, (list, tuple)):
        lists = [a[1] for a in allowed if isinstance(a, tuple) and a[0] is list]
        if lists:
            item_tp = lists[0]
            for item in value:
                problem, _ = _value_error(item, item_tp)
                if problem or isinstance(item, (list, dict)):
                    return f"list items must be {_describe(item_tp)}, got {item!r}", value
            return None, list(value)
    elif isinstance(value, dict):
        if dict in allowed:
            return None, value
    return f"must be {_describe(tp)}, got {_describe_value(value)}", value


def _describe(tp) -> str:
    words = []
    for a in _allowed(tp):
        if a is None:
            continue
        if isinstance(a, tuple):
            words.append("one of " + ", ".join(map(str, a[1])) if a[0] == "literal" else "a list")
        else:
            words.append(_TYPE_WORDS.get(a, getattr(a, "__name__", str(a))))
    words = list(dict.fromkeys(words))
    return " or ".join(words) or "a value"


def _describe_value(value) -> str:
    kind = ("true/false" if isinstance(value, bool) else "a list" if isinstance(value, (list, tuple))
            else "a mapping" if isinstance(value, dict) else type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, (list, dict)) else f"{kind} {value!r}"


def load_recipe(path: str | os.PathLike, dataclass_types) -> dict:
    """Strictly read a recipe: a mapping of known keys whose values fit their field types.

    Returns the mapping (with ``2.0``-style whole numbers turned into ints).
    """
    p = Path(path)
    config = load_yaml(p)  # missing file, directory, non-UTF-8, invalid YAML, key given twice
    if not isinstance(config, dict):
        raise UserError(f"recipe {p} must be a YAML mapping of argument names to values")
    lines = key_lines(p.read_text(encoding="utf-8"))
    keys = known_keys(dataclass_types)
    for k in config:
        if k not in keys:
            close = difflib.get_close_matches(str(k), sorted(keys), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where = f"{p}:{lines[k]}" if k in lines else str(p)
            raise UserError(f"recipe {where}: unknown key {k!r}{hint}; keys must be fields of "
                            "ScriptArguments, SFTConfig or ModelConfig")
    env = config.get("env", {})
    if not isinstance(env, dict):
        raise UserError(f"recipe {p}:{lines.get('env', '?')}: env must be a mapping of variable names to values")
    fields = _field_types(dataclass_types)
    for k, v in list(config.items()):
        if k == "env":
            continue
        problem, config[k] = _value_error(v, fields[k])
        if problem:
            where = f"{p}:{lines[k]}" if k in lines else str(p)
            raise UserError(f"recipe {where}: {k} {problem}")
    return config


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


def check_ranges(script_args, training_args, model_args, *, recipe: str | None, recipe_keys: dict[str, int],
                 cli_keys: set[str]) -> None:
    problems = range_problems(script_args, training_args, model_args)
    if problems:
        key, problem = problems[0]
        if key in cli_keys or key not in recipe_keys:
            where = f"--{key}"
        else:
            where = f"recipe {recipe}:{recipe_keys[key]}: {key}"
        raise UserError(f"{where} {problem}")


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
