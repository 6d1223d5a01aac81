"""REAL / SFT training of a verifier: TRL ``SFTTrainer`` + LoRA, driven by a recipe.

Multi-process::

    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml \\
        -m real.train --config recipes/llama-3.1-8b-instruct/real.yaml

One process: ``real-train --config recipes/tiny/llama-sft.yaml``.

Arguments are TRL's own dataclasses (``ScriptArguments``, ``SFTConfig``,
``ModelConfig``) parsed by ``TrlParser``: defaults < recipe YAML < command
line; an unknown YAML key is an error. Subclasses only add fields:

- ``variant`` (script): the variant the recipe means; checked against the
  ``variant`` column of the pairs dataset so a recipe cannot silently train on
  the wrong data.
- ``global_batch_size`` (training): when set, ``gradient_accumulation_steps``
  is derived as ``global / (per_device_train_batch_size × processes)``, so
  the same recipe keeps the paper's batch of 32 on 1, 4 or 8 GPUs.

``dataset_name`` is the output of ``real-data pairs``: its directory (a
``DatasetDict`` saved with ``save_to_disk``), or a ``.jsonl`` file of the same
rows; the split is ``dataset_train_split`` (default ``train``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, SFTConfig

from data_prep.core.cli import set_interrupt_note
from data_prep.core.errors import UserError
from data_prep.core.modelref import is_hub_id
from real import recipe_checks, resume_checks
from real.pair_lengths import enforce_max_length

logger = logging.getLogger("real.train")

VARIANT_NAMES = ("sft", "no_ablation", "no_enhancement", "real")
# End-of-turn tokens of common chat templates: generation must stop on them.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
# Pad tokens to prefer over reusing eos (Llama-3.1 ships a reserved pad token).
PAD_CANDIDATES = ("<|finetune_right_pad_id|>", "<|endoftext|>", "<pad>", "<|pad|>")


def _accelerator_available() -> bool:
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
            "help": "Training variant the recipe is for (sft, no_ablation, no_enhancement, real); must match the "
            "`variant` column of the pairs dataset. Also written to the model card.",
            "choices": list(VARIANT_NAMES),
        },
    )
    drop_overlong: bool = field(
        default=False,
        metadata={"help": "Train without the pairs longer than max_length tokens (counted in the model card) "
                  "instead of refusing the dataset. TRL would otherwise truncate them and silently drop those "
                  "whose answer is cut off."},
    )
    start_over: bool = field(
        default=False,
        metadata={"help": "Do not resume: delete the checkpoints and results of the earlier run in output_dir "
                  "and train from step 0."},
    )
    resume_with_changes: bool = field(
        default=False,
        metadata={"help": "Resume the last checkpoint even though its data, variant, seed, max_length, "
                  "drop_overlong or lora_dropout differ from the new settings. (Model, learning rate, schedule, "
                  "batch, epochs/max_steps and LoRA shapes cannot change on resume: use start_over.)"},
    )


@dataclass
class RealSFTConfig(SFTConfig):
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Target global batch (per_device_train_batch_size x gradient_accumulation_steps x processes). "
            "When set, gradient_accumulation_steps is derived from it at launch; it must divide evenly."
        },
    )

    def __post_init__(self):
        # TRL turns bf16 on by default; without a GPU TrainingArguments refuses it, and bf16
        # matmuls on a CPU without native bf16 are ~100x slower. Fall back to fp32 on CPU.
        if not _accelerator_available() and (self.bf16 is None or self.bf16 or not self.use_cpu):
            if self.bf16 or self.bf16 is None:
                logger.warning("no GPU found: training on CPU in fp32 (bf16=False, use_cpu=True)")
            self.bf16 = False
            self.fp16 = False
            self.use_cpu = True
        super().__post_init__()


DATACLASSES = (RealScriptArguments, RealSFTConfig, ModelConfig)


def make_parser():
    from trl import TrlParser

    parser = TrlParser(DATACLASSES, prog="real-train")

    def error(message: str):  # argparse would print the whole (huge) usage first
        raise UserError(message)

    parser.error = error
    return parser


# ---------------------------------------------------------------------------
# Recipe checks (pure; used by the tests to parse every recipe)
# ---------------------------------------------------------------------------

def known_keys() -> set[str]:
    return recipe_checks.known_keys(DATACLASSES)


def check_recipe(path: str | os.PathLike) -> dict:
    """Strictly load a recipe YAML: unknown keys (did-you-mean), keys given twice, values of the wrong type."""
    return recipe_checks.load_recipe(path, DATACLASSES)


def parse_args(argv: list[str] | None = None):
    """(script_args, training_args, model_args); defaults < YAML < CLI.

    The recipe is read here (strictly) rather than by ``TrlParser``, whose
    ``yaml.safe_load`` keeps the last of two equal keys; its values become the
    parser's defaults exactly as ``TrlParser.parse_args_and_config`` does.
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
        config = check_recipe(recipe)
        recipe_lines = recipe_checks.key_lines(Path(recipe).read_text(encoding="utf-8"))
        for key, value in (config.pop("env", None) or {}).items():
            os.environ[str(key)] = str(value)
        parser.set_defaults_with_config(**config)
    try:
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(args=rest)
    except ValueError as exc:  # dataclass __post_init__ checks (e.g. fp16 and bf16 together), unused arguments
        raise UserError(str(exc).splitlines()[0]) from None
    model_args.lora_target_modules = recipe_checks.normalize_target_modules(model_args.lora_target_modules)
    cli_keys = {a[2:].split("=", 1)[0].replace("-", "_") for a in rest if a.startswith("--")}
    recipe_checks.check_ranges(script_args, training_args, model_args, recipe=recipe, recipe_keys=recipe_lines,
                               cli_keys=cli_keys)
    return script_args, training_args, model_args


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def load_pairs(path: str | None, split: str = "train"):
    """The pairs dataset of ``real-data pairs``: a save_to_disk dir or a JSONL file."""
    from datasets import DatasetDict, load_dataset, load_from_disk

    if not path:
        raise UserError("no training data: set dataset_name to the output of `real-data pairs`")
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"dataset {path!r} does not exist; build it with `real-data pairs`")
    if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "state.json").exists()):
        ds = load_from_disk(str(p))
    elif p.is_dir() and (p / "pairs.jsonl").exists():
        ds = load_dataset("json", data_files=str(p / "pairs.jsonl"))
    elif p.is_file() and p.suffix in (".jsonl", ".json"):
        ds = load_dataset("json", data_files=str(p))
    else:
        raise UserError(f"dataset {path!r} is neither a `real-data pairs` directory nor a .jsonl file")
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise UserError(f"dataset {path!r} has no split {split!r} (it has {', '.join(ds)})")
        ds = ds[split]
    missing = {"prompt", "completion"} - set(ds.column_names)
    if missing:
        raise UserError(f"dataset {path!r} has no {'/'.join(sorted(missing))} column: it is not a pairs dataset")
    if len(ds) == 0:
        raise UserError(f"dataset {path!r} is empty")
    return ds


def check_variant(ds, variant: str | None, path: str) -> dict:
    """Counts per kind/variant; refuse a dataset built for another variant."""
    info = {"pairs": len(ds)}
    if "variant" in ds.column_names:
        found = sorted(set(ds["variant"]))
        info["variants"] = found
        if variant is not None and found != [variant]:
            raise UserError(
                f"dataset {path!r} was built for variant {', '.join(found)} but the recipe says variant {variant!r}"
            )
    if "kind" in ds.column_names:
        kinds: dict[str, int] = {}
        for k in ds["kind"]:
            kinds[k] = kinds.get(k, 0) + 1
        info["by_kind"] = kinds
    return info


def _is_data_file(f: Path, root: Path) -> bool:
    # `datasets` writes map/filter caches (cache-*.arrow) beside the data; they are not the data.
    rel = f.relative_to(root)
    return f.is_file() and not f.name.startswith("cache-") and not any(part.startswith(".") for part in rel.parts)


def data_fingerprint(path: str) -> str:
    """sha256 over the dataset's files (sorted by relative path), for the model card and resume checks."""
    p = Path(path).expanduser()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if _is_data_file(f, p))
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Model and tokenizer
# ---------------------------------------------------------------------------

def check_model_path(name: str | None) -> str:
    if not name:
        raise UserError("no base model: set model_name_or_path in the recipe or pass --model_name_or_path")
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UserError(f"base model path {name!r} is a file; give the model's directory (with config.json)")
        if not (p / "config.json").is_file():
            raise UserError(f"base model path {name!r} has no config.json, so it is not a saved model")
        return str(p)
    looks_like_path = not is_hub_id(name)
    if looks_like_path or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserError(f"base model path {name!r} does not exist")
    return name


def end_of_turn_ids(tokenizer) -> list[int]:
    """Ids of the template's end-of-turn tokens (and eos), e.g. <|eot_id|> / <|im_end|>."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = "".join(template.values())
    vocab = tokenizer.get_vocab()
    ids = [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab and t in template]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(ids))


def set_generation_eos(model, tokenizer) -> list[int]:
    """Make generation stop after the answer's end-of-turn token; returns the eos ids."""
    gc = model.generation_config
    current = gc.eos_token_id
    current = [] if current is None else [current] if isinstance(current, int) else list(current)
    eos = list(dict.fromkeys(end_of_turn_ids(tokenizer) + current))
    gc.eos_token_id = eos
    if gc.pad_token_id is None and tokenizer.pad_token_id is not None:
        gc.pad_token_id = tokenizer.pad_token_id
    return eos


def ensure_pad_token(tokenizer) -> str:
    """Set a pad token if missing: a reserved pad-like token, else eos.

    Padding positions never carry loss (labels are -100 outside the
    completion), so reusing eos is safe; a dedicated token is preferred.
    """
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        pick = next((t for t in PAD_CANDIDATES if t in vocab and t != tokenizer.eos_token), None)
        tokenizer.pad_token = pick or tokenizer.eos_token
        logger.warning("tokenizer has no pad token: using %r", tokenizer.pad_token)
    return tokenizer.pad_token


def load_tokenizer(model_args: ModelConfig, training_args: RealSFTConfig):
    from transformers import AutoTokenizer

    name = check_model_path(model_args.model_name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=model_args.model_revision,
                                                  trust_remote_code=training_args.trust_remote_code)
    except OSError as exc:
        raise UserError(f"could not load the tokenizer of {name!r} ({str(exc).splitlines()[0]})") from None
    if not tokenizer.chat_template:
        raise UserError(f"the tokenizer of {name!r} has no chat template; use an instruct model")
    ensure_pad_token(tokenizer)
    return tokenizer


def load_model(model_args: ModelConfig, training_args: RealSFTConfig):
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM
    from trl import get_quantization_config

    name = check_model_path(model_args.model_name_or_path)
    common = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    dtype = model_args.dtype
    if training_args.use_cpu and dtype in ("bfloat16", "float16"):
        logger.warning("training on CPU: loading the model in float32 instead of %s", dtype)
        dtype = "float32"
    kwargs = dict(common, attn_implementation=model_args.attn_implementation, use_safetensors=True,
                  dtype=dtype if dtype in (None, "auto") else getattr(torch, dtype))
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        # one full copy per process, on its own device (k-bit weights cannot be moved later)
        kwargs.update(quantization_config=quantization_config,
                      device_map={"": PartialState().local_process_index})
    kwargs.update(training_args.model_init_kwargs or {})
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise UserError(f"could not load base model {name!r} ({str(exc).splitlines()[0]})") from None
    return model


def load_model_and_tokenizer(model_args: ModelConfig, training_args: RealSFTConfig):
    tokenizer = load_tokenizer(model_args, training_args)
    return load_model(model_args, training_args), tokenizer


# ---------------------------------------------------------------------------
# Checkpoints, batch size, outputs
# ---------------------------------------------------------------------------

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


def derive_accumulation(global_batch: int, per_device: int, world_size: int) -> int:
    denom = per_device * world_size
    if global_batch % denom:
        raise UserError(
            f"global_batch_size {global_batch} is not a multiple of per_device_train_batch_size {per_device} "
            f"x {world_size} processes"
        )
    return global_batch // denom


# Set per process by the launcher, not by the recipe.
_RUNTIME_FIELDS = {"local_rank"}


def resolved_config(script_args, training_args, model_args) -> dict:
    """Every argument as one flat mapping, re-usable as ``--config`` (secrets redacted)."""
    out: dict = {}
    for obj in (script_args, training_args, model_args):
        d = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
        for f in dataclasses.fields(obj):
            if not f.init or f.name not in d or f.name in _RUNTIME_FIELDS:
                continue
            v = d[f.name]
            if f.name.endswith("_token"):  # to_dict() masks these as "<NAME>"
                v = getattr(obj, f.name)
                if v is not None and f.name not in ("eos_token", "pad_token"):
                    continue  # a secret (hub_token): never written
            out[f.name] = v
    return json.loads(json.dumps(out, default=str))


def _plain(x):
    return getattr(x, "value", x)


def model_card(*, base_model, variant, data_path, data_info, data_sha, args, model_args, metrics, versions) -> str:
    world = metrics.get("world_size")
    lines = [
        "---",
        f"base_model: {base_model}",
        "library_name: peft" if model_args.use_peft else "library_name: transformers",
        "tags: [real-fae, fact-verification, trl, sft" + (", lora]" if model_args.use_peft else "]"),
        "---",
        "",
        f"# Fact-checking verifier: {variant or 'unknown variant'} on {Path(str(base_model)).name}",
        "",
        f"Trained with `real-train` (TRL SFTTrainer, completion-only loss) on the `{variant}` variant of the "
        "REAL training pairs (SPEC §4). Answers are one JSON object `{\"label\": ..., \"evidence\": [...]}`.",
        "",
        "## Data",
        "",
        f"- path: `{data_path}`",
        f"- sha256: `{data_sha}`",
        f"- pairs: {data_info.get('pairs')}" + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(data_info.get('by_kind', {}).items()))})" if data_info.get("by_kind") else ""),
        f"- pairs trained on: {metrics.get('train_samples', data_info.get('pairs'))}"
        + (f" ({data_info['dropped_overlong']} longer than max_length {args.max_length} tokens dropped "
           "with drop_overlong)" if data_info.get("dropped_overlong") else ""),
        "",
        "## Hyper-parameters",
        "",
        "| name | value |",
        "|---|---|",
    ]
    hp = {
        "base model": base_model,
        "variant": variant,
        "LoRA": (f"r={model_args.lora_r}, alpha={model_args.lora_alpha}, dropout={model_args.lora_dropout}, "
                 f"targets={model_args.lora_target_modules}") if model_args.use_peft else "off (full fine-tuning)",
        "optimizer": _plain(args.optim),
        "learning rate": args.learning_rate,
        "scheduler": f"{_plain(args.lr_scheduler_type)}, warmup steps {args.warmup_steps or 0}",
        "epochs": args.num_train_epochs,
        "max steps": args.max_steps,
        "per-device batch": args.per_device_train_batch_size,
        "gradient accumulation": args.gradient_accumulation_steps,
        "processes": world,
        "global batch": metrics.get("global_batch_size"),
        "max length": args.max_length,
        "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "seed": args.seed,
    }
    lines += [f"| {k} | {v} |" for k, v in hp.items()]
    lines += ["", "## Results", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(metrics.items())]
    lines += ["", "## Versions", ""]
    lines += [f"- {k} {v}" for k, v in versions.items()]
    lines += ["", "The full argument set is in `resolved_config.yaml` (usable as `real-train --config`).", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

@dataclass
class Run:
    """Everything ``train`` needs after set-up (also used by the tests to inspect labels)."""

    trainer: object
    model: object  # the base transformers model (PEFT wraps it)
    tokenizer: object
    data_info: dict
    eos_ids: list
    resume: str | None
    global_batch: int
    data_sha: str | None = None


def _on_main_then_share(training_args, fn):
    """Run ``fn`` on the main process only and give its result (or its refusal) to every rank.

    The other ranks wait at the broadcast, so none races ahead of the main
    process's lock / resume decision; a refusal stops them too (quietly: the
    main process prints the line).
    """
    import torch.distributed as dist

    is_main = training_args.process_index == 0
    outcome = [None, None]
    if is_main:
        try:
            outcome = [fn(), None]
        except UserError as exc:
            outcome = [None, (str(exc), exc.exit_code)]
            if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
                raise
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    result, error = outcome
    if error is not None:
        if is_main:
            raise UserError(error[0])
        raise SystemExit(error[1])
    return result


def check_output_paths(training_args) -> None:
    out = Path(training_args.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir {str(out)!r} is a file; give a directory for the adapter and checkpoints")
    resume = training_args.resume_from_checkpoint
    if resume and not Path(resume).is_dir():
        what = "a file" if Path(resume).exists() else "missing"
        raise UserError(f"resume_from_checkpoint {resume!r} is {what}, not a checkpoint directory")


def check_target_modules(model_args, training_args) -> None:
    """LoRA targets that select no module stop here, from the config alone (no weights load)."""
    if not model_args.use_peft:
        return
    names = recipe_checks.model_module_names(check_model_path(model_args.model_name_or_path),
                                             revision=model_args.model_revision,
                                             trust_remote_code=training_args.trust_remote_code)
    if names is not None:
        problem = recipe_checks.target_module_problem(model_args.lora_target_modules, names)
        if problem:
            raise UserError(problem)


def choose_start(script_args, training_args, definition: dict) -> tuple[str | None, int]:
    """(checkpoint to resume or None, its step): main process only, under the lock."""
    out = training_args.output_dir
    explicit = training_args.resume_from_checkpoint
    if script_args.start_over:
        if explicit:
            raise UserError("start_over and resume_from_checkpoint contradict each other; pass one of them")
        removed = resume_checks.clear_previous_run(out)
        if removed:
            logger.warning("start_over: removed %d entries of the earlier run in %s (%s)", len(removed), out,
                           ", ".join(removed[:6]) + (", ..." if len(removed) > 6 else ""))
        return None, 0
    resume = explicit or last_complete_checkpoint(out)
    if not resume:
        return None, 0
    step, diffs = resume_checks.check_resume(resume, definition, max_steps=training_args.max_steps,
                                             allow_changes=script_args.resume_with_changes)
    if diffs:
        logger.warning("resume_with_changes: resuming %s with changed settings: %s", resume, "; ".join(diffs))
    return resume, step


def build_trainer(script_args: RealScriptArguments, training_args: RealSFTConfig, model_args: ModelConfig,
                  *, callbacks: list | None = None) -> Run:
    """Check inputs (cheap checks first), load data, check lengths and resume, then the model and SFTTrainer."""
    from trl import SFTTrainer, get_peft_config

    check_model_path(model_args.model_name_or_path)
    check_output_paths(training_args)
    ds = load_pairs(script_args.dataset_name, script_args.dataset_train_split)
    data_info = check_variant(ds, script_args.variant, script_args.dataset_name)
    train_ds = ds.select_columns(["prompt", "completion"])

    world_size = training_args.world_size
    if training_args.global_batch_size:
        acc = derive_accumulation(training_args.global_batch_size, training_args.per_device_train_batch_size, world_size)
        if acc != training_args.gradient_accumulation_steps:
            logger.warning("global_batch_size %d: gradient_accumulation_steps %d -> %d for %d process(es)",
                           training_args.global_batch_size, training_args.gradient_accumulation_steps, acc, world_size)
        training_args.gradient_accumulation_steps = acc
    global_batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world_size
    check_target_modules(model_args, training_args)

    tokenizer = load_tokenizer(model_args, training_args)
    train_ds, lengths = enforce_max_length(train_ds, tokenizer, training_args.max_length,
                                           drop_overlong=script_args.drop_overlong,
                                           data_path=str(script_args.dataset_name),
                                           num_proc=training_args.dataset_num_proc)
    data_info.update(longest_pair_tokens=lengths.longest, dropped_overlong=lengths.dropped)
    if lengths.dropped:
        logger.warning("drop_overlong: training on %d of %d pairs (%d longer than max_length %d tokens)",
                       lengths.kept, lengths.pairs, lengths.dropped, training_args.max_length)

    def decide():
        sha = data_fingerprint(script_args.dataset_name)
        definition = resume_checks.run_definition(script_args=script_args, training_args=training_args,
                                                  model_args=model_args, data_sha=sha, global_batch=global_batch)
        resume, _ = choose_start(script_args, training_args, definition)
        return resume, definition, sha

    resume, definition, data_sha = _on_main_then_share(training_args, decide)

    model = load_model(model_args, training_args)
    eos_ids = set_generation_eos(model, tokenizer)
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[resume_checks.RunDefinition(definition), *(callbacks or [])],
    )
    if len(trainer.train_dataset) != lengths.kept:  # TRL dropped pairs our length check let through
        raise UserError(f"TRL kept {len(trainer.train_dataset)} of the {lengths.kept} pairs to train on; "
                        "some were dropped during its preparation (pass --debug and report it)")
    return Run(trainer, model, tokenizer, data_info, eos_ids, resume, global_batch, data_sha)


def train(script_args: RealScriptArguments, training_args: RealSFTConfig, model_args: ModelConfig,
          argv: list[str] | None = None) -> dict:
    """Train under an exclusive lock on output_dir (main process; the other ranks wait for it)."""
    from data_prep.core.runlock import RunLock

    check_output_paths(training_args)
    lock = RunLock(training_args.output_dir, "real-train", is_dir=True)
    _on_main_then_share(training_args, lambda: lock.acquire() and None)
    try:
        return _train_locked(script_args, training_args, model_args, argv)
    finally:
        lock.release()


def _train_locked(script_args, training_args, model_args, argv) -> dict:
    import peft
    import torch
    import transformers
    import trl
    import yaml

    again = resume_checks.resume_command(list(sys.argv[1:] if argv is None else argv))
    note = resume_checks.InterruptNote(training_args.output_dir, again, None)  # sets the Ctrl-C line
    run = build_trainer(script_args, training_args, model_args, callbacks=[note])
    trainer, tokenizer, resume, global_batch = run.trainer, run.tokenizer, run.resume, run.global_batch
    data_info, eos_ids = run.data_info, run.eos_ids
    model = run.model
    train_ds = trainer.train_dataset
    acc = trainer.accelerator
    acc.print(
        f"real-train: world size {acc.num_processes} (rank {acc.process_index}), per-device batch "
        f"{training_args.per_device_train_batch_size} x accumulation {training_args.gradient_accumulation_steps} "
        f"x {acc.num_processes} processes = global batch {global_batch}; {len(train_ds)} pairs; "
        f"variant {script_args.variant}; device {acc.device}"
    )
    if resume:
        step = json.loads((Path(resume) / "trainer_state.json").read_text()).get("global_step")
        note.show(resume, step)
        acc.print(f"real-train: resuming from {resume} (global step {step})")
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:  # (and SIGTERM): end tqdm's bar line so the one-line note starts a line
        print(file=sys.stderr, flush=True)
        raise
    set_interrupt_note(f"training finished but saving the final adapter to {training_args.output_dir} was cut "
                       f"short; run again to resume from the last checkpoint: {again}")

    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    metrics = dict(result.metrics)
    metrics.update(train_samples=len(train_ds), pairs_in_dataset=data_info["pairs"],
                   pairs_dropped_overlong=data_info.get("dropped_overlong", 0),
                   world_size=acc.num_processes, global_batch_size=global_batch)
    if resume:
        metrics["resumed_from"] = str(resume)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    if trainer.is_world_process_zero():
        model.generation_config.eos_token_id = eos_ids
        model.generation_config.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        cfg = resolved_config(script_args, training_args, model_args)
        (out / "resolved_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=True), encoding="utf-8")
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "trl": trl.__version__, "peft": peft.__version__}
        card = model_card(base_model=model_args.model_name_or_path, variant=script_args.variant,
                          data_path=os.path.abspath(script_args.dataset_name), data_info=data_info,
                          data_sha=run.data_sha or data_fingerprint(script_args.dataset_name), args=training_args,
                          model_args=model_args, metrics=metrics, versions=versions)
        (out / "README.md").write_text(card, encoding="utf-8")
    acc.print(f"real-train: saved to {out}")
    if hasattr(trainer, "end"):
        trainer.end()
    set_interrupt_note(None)
    return metrics


def main(argv: list[str] | None = None) -> int:
    from data_prep.core.cli import run_guarded

    def body(argv: list[str]) -> int:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
        script_args, training_args, model_args = parse_args(argv)
        train(script_args, training_args, model_args, argv)
        return 0

    return run_guarded("real-train", body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
