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
import difflib
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig, ScriptArguments, SFTConfig

from data_prep._dispatch import UserError

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

    return TrlParser(DATACLASSES, prog="real-train")


# ---------------------------------------------------------------------------
# Recipe checks (pure; used by the tests to parse every recipe)
# ---------------------------------------------------------------------------

def known_keys() -> set[str]:
    keys = {"env"}
    for dc in DATACLASSES:
        keys |= {f.name for f in dataclasses.fields(dc) if f.init}
    return keys


def check_recipe(path: str | os.PathLike) -> dict:
    """Load a recipe YAML and reject unknown keys with a did-you-mean hint."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"recipe {str(p)!r} does not exist")
    try:
        config = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise UserError(f"recipe {p}{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(config, dict):
        raise UserError(f"recipe {p} must be a YAML mapping of argument names to values")
    keys = known_keys()
    unknown = [k for k in config if k not in keys]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(str(k), sorted(keys), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(
            f"recipe {p}: unknown key {k!r}{hint}; keys must be fields of ScriptArguments, SFTConfig or ModelConfig"
        )
    return config


def parse_args(argv: list[str] | None = None):
    """(script_args, training_args, model_args); defaults < YAML < CLI."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise UserError("--config needs a recipe path")
        check_recipe(argv[i + 1])
    parser = make_parser()
    try:
        return parser.parse_args_and_config(argv)
    except ValueError as exc:  # dataclass __post_init__ checks (e.g. fp16 and bf16 together)
        raise UserError(str(exc).splitlines()[0]) from None


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


def data_fingerprint(path: str) -> str:
    """sha256 over the dataset's files (sorted by relative path), for the model card."""
    p = Path(path).expanduser()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
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

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_path(name: str | None) -> str:
    if not name:
        raise UserError("no base model: set model_name_or_path in the recipe or pass --model_name_or_path")
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise UserError(f"base model path {name!r} has no config.json, so it is not a saved model")
        return str(p)
    looks_like_path = name.startswith((".", "/", "~")) or not _HUB_ID.match(name)
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


def load_model_and_tokenizer(model_args: ModelConfig, training_args: RealSFTConfig):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from accelerate import PartialState
    from trl import get_quantization_config

    name = check_model_path(model_args.model_name_or_path)
    common = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **common)
    except OSError as exc:
        raise UserError(f"could not load the tokenizer of {name!r} ({str(exc).splitlines()[0]})") from None
    if not tokenizer.chat_template:
        raise UserError(f"the tokenizer of {name!r} has no chat template; use an instruct model")
    ensure_pad_token(tokenizer)

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
    return model, tokenizer


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


def build_trainer(script_args: RealScriptArguments, training_args: RealSFTConfig, model_args: ModelConfig) -> Run:
    """Check inputs (cheap checks first), load data and model, build the SFTTrainer."""
    from trl import SFTTrainer, get_peft_config

    check_model_path(model_args.model_name_or_path)
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

    resume = training_args.resume_from_checkpoint
    if resume:
        if not Path(resume).is_dir():
            raise UserError(f"resume_from_checkpoint {resume!r} is not a checkpoint directory")
    else:
        resume = last_complete_checkpoint(training_args.output_dir)

    model, tokenizer = load_model_and_tokenizer(model_args, training_args)
    eos_ids = set_generation_eos(model, tokenizer)
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    return Run(trainer, model, tokenizer, data_info, eos_ids, resume, global_batch)


def train(script_args: RealScriptArguments, training_args: RealSFTConfig, model_args: ModelConfig) -> dict:
    import peft
    import torch
    import transformers
    import trl
    import yaml

    run = build_trainer(script_args, training_args, model_args)
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
        acc.print(f"real-train: resuming from {resume} (global step {step})")
    result = trainer.train(resume_from_checkpoint=resume)

    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    metrics = dict(result.metrics)
    metrics.update(train_samples=len(train_ds), world_size=acc.num_processes, global_batch_size=global_batch)
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
                          data_sha=data_fingerprint(script_args.dataset_name), args=training_args,
                          model_args=model_args, metrics=metrics, versions=versions)
        (out / "README.md").write_text(card, encoding="utf-8")
    acc.print(f"real-train: saved to {out}")
    if hasattr(trainer, "end"):
        trainer.end()
    return metrics


def main(argv: list[str] | None = None) -> int:
    from data_prep._dispatch import run_guarded

    def body(argv: list[str]) -> int:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
        script_args, training_args, model_args = parse_args(argv)
        train(script_args, training_args, model_args)
        return 0

    return run_guarded("real-train", body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
