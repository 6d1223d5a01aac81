"""``trainer: grpo``: TRL's ``GRPOTrainer`` built the way :func:`real.training.trainer.build_trainer` builds
``SFTTrainer`` (the same checks, lengths, resume decision, model loading and callbacks), with the
on-policy reward of :mod:`real.training.onpolicy` bound to the policy being trained."""

from __future__ import annotations

import logging
from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.tied_embeddings import untie_for_adapter
from real.training import checkpoints, fingerprint
from real.training.model import load_model, load_tokenizer, set_generation_eos
from real.training.onpolicy import OnPolicyReward, PolicyJudge, pairs_line_ids
from real.training.pair_lengths import enforce_max_length

logger = logging.getLogger("real.train")


def load_records_by_id(path: str | None) -> dict:
    from data_prep.records import load_records

    if not path:
        raise UserError("trainer grpo needs `records`: the claim records (.jsonl) the pairs were built from")
    if not Path(path).is_file():
        raise UserError(f"records {path!r} does not exist")
    return {r.id: r for r in load_records(path)}


def start_model(model_args, training_args, script_args):
    """(model, peft_config for GRPOTrainer): a new LoRA from the recipe, or ``init_adapter`` trained further."""
    from trl import get_peft_config

    model = load_model(model_args, training_args)
    if not script_args.init_adapter:
        return model, get_peft_config(model_args)
    from peft import PeftModel

    if not (Path(script_args.init_adapter) / "adapter_config.json").is_file():
        raise UserError(f"init_adapter {script_args.init_adapter!r} holds no adapter_config.json (a real-train "
                        "output directory)")
    untie_for_adapter(model, script_args.init_adapter)
    return PeftModel.from_pretrained(model, script_args.init_adapter, is_trainable=True), None


def build_grpo_trainer(script_args, training_args, model_args, *, callbacks: list | None = None, plan=None):
    from trl import GRPOTrainer

    from real.training.trainer import Run, on_main_then_share, plan_run

    plan = plan or plan_run(script_args, training_args, model_args)
    data_info = dict(plan.data_info)
    records = load_records_by_id(script_args.records)
    missing = sorted(set(plan.train_ds["record_id"]) - set(records))
    if missing:
        raise UserError(f"records {script_args.records!r} lacks {len(missing)} record(s) the pairs name "
                        f"(first: {missing[0]!r}); give the records the pairs were built from")
    tokenizer = load_tokenizer(model_args, training_args)
    train_ds, lengths = enforce_max_length(plan.train_ds, tokenizer, training_args.max_length,
                                           drop_overlong=script_args.drop_overlong,
                                           data_path=str(script_args.dataset_name),
                                           num_proc=getattr(training_args, "dataset_num_proc", None))
    data_info.update(longest_pair_tokens=lengths.longest, dropped_overlong=lengths.dropped)
    train_ds = train_ds.remove_columns(["completion"])
    start = on_main_then_share(
        training_args, lambda: checkpoints.choose_start(script_args, training_args, plan.definition),
        "the resume decision")
    model, peft_config = start_model(model_args, training_args, script_args)
    eos_ids = set_generation_eos(model, tokenizer)
    line_ids = pairs_line_ids(script_args.dataset_name)
    judge = PolicyJudge(tokenizer, line_ids, training_args.judge_batch_size)
    reward = OnPolicyReward(records, judge, line_ids=line_ids, control_seed=training_args.control_seed)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward.functions(),
        args=training_args,
        train_dataset=train_ds,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[fingerprint.RunDefinition(plan.definition), *(callbacks or [])],
    )
    judge.bind(trainer.model)
    data_info.update(line_ids=line_ids, init_adapter=script_args.init_adapter)
    base = getattr(trainer.model, "get_base_model", lambda: trainer.model)()
    return Run(trainer, base, tokenizer, data_info, eos_ids, start.checkpoint, plan.global_batch, plan.data_sha,
               plan.definition)
