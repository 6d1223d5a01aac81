"""One training run: cheap checks first, then the resume decision, the model, ``SFTTrainer``, the saved outputs.

Under ``accelerate launch`` every rank runs this; decisions that read or
change ``output_dir`` (the lock, the fingerprint of the data, resume or start
over) are taken by the main process and shared, so no rank races ahead of it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.entry import set_interrupt_note
from real_fae_core.errors import RunFailure, Terminated, UserError
from real_fae_core.runlock import RunLock
from real_fae_core.tied_embeddings import untie_for_adapter
from real_fae_core.lifeline import run_stopping, set_stage
from real.training import checkpoints, cpu_loss, engines, fingerprint
from real.training.args import accelerator_available
from real.training.data import check_variant, data_fingerprint, load_pairs
from real.training.fae_callback import fae_eval_callback
from real.training.interrupt import InterruptNote, resume_command
from real.training.model import check_model_path, check_target_modules, load_model, load_tokenizer, set_generation_eos
from real.training.model_card import model_card, resolved_config
from data_prep.records import load_records
from real.training.onpolicy import (PROMPT_COLUMNS, OnPolicyReward, PolicyJudge, pairs_line_ids,
                                    seeded_sampling_trainer)
from real.training.pair_lengths import enforce_max_length, fitted_for_padding_free

logger = logging.getLogger("real.train")


@dataclass
class Plan:
    """The run as known before any tokenizer or weights load: data, batch, fingerprint."""

    train_ds: object  # prompt/completion columns only
    data_info: dict
    global_batch: int
    data_sha: str
    definition: dict


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
    definition: dict | None = None


def on_main_then_share(training_args, fn, what: str):
    """Run ``fn`` on the main process only and give its result (or its refusal) to every rank.

    The other ranks wait at the broadcast, so none races ahead of the main
    process's lock / resume decision; a refusal stops them too (quietly: the
    main process prints the line). The wait is bounded by the process group's
    timeout (``ddp_timeout``); a peer that is gone or past it ends the wait with
    one line saying what was being shared (``what``), not a gloo/NCCL trace.
    Not ``main_process_first`` (accelerate, transformers): that runs the block on
    every rank, main first (docs/architecture.md).
    """
    import torch.distributed as dist

    is_main = training_args.process_index == 0
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    outcome = [None, None]
    if is_main:
        try:
            outcome = [fn(), None]
        except UserError as exc:
            outcome = [None, (str(exc), exc.exit_code)]
            if not distributed:
                raise
    if distributed:
        try:
            dist.broadcast_object_list(outcome, src=0)
        except RuntimeError as exc:  # DistBackendError / DistNetworkError: a rank gone, or ddp_timeout passed
            raise UserError(peer_lost_message(training_args, what, exc)) from None
    result, error = outcome
    if error is not None:
        if is_main:
            raise UserError(error[0])
        raise SystemExit(error[1])
    return result


def _first_sentence(exc: BaseException) -> str:
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", detail).split(". ")[0]  # gloo's "[source:line] " and its advice off


PEER_GONE = ("closed by peer", "reset by peer", "Broken pipe", "remote worker", "Connection refused")


def peer_lost(exc: BaseException) -> bool:
    """A collective failed because another rank is gone (torch's DistError, or gloo's closed connection)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    return isinstance(exc, kinds) or any(s in str(exc) for s in PEER_GONE)


def peer_lost_message(training_args, what: str, exc: BaseException) -> str:
    """The one line a rank prints when the others did not take part in sharing ``what`` in time."""
    detail = _first_sentence(exc)
    return (f"rank {training_args.process_index} of {training_args.world_size}: gave up waiting for the other "
            f"processes to share {what} (ddp_timeout {training_args.ddp_timeout} s): {detail}; another rank "
            "stopped (see its error) or is stuck; if the main process is only slow, raise --ddp_timeout")


def check_output_paths(training_args) -> None:
    """Refuse, before anything is loaded, an ``output_dir`` that is a file and a ``resume_from_checkpoint``
    that is not a directory (one :class:`UserError` line each)."""
    out = Path(training_args.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir {str(out)!r} is a file; give a directory for the adapter and checkpoints")
    resume = training_args.resume_from_checkpoint
    if resume and not Path(resume).is_dir():
        what = "a file" if Path(resume).exists() else "missing"
        raise UserError(f"resume_from_checkpoint {resume!r} is {what}, not a checkpoint directory")


def derive_accumulation(global_batch: int, per_device: int, world_size: int) -> int:
    """Gradient accumulation steps so that ``per_device`` x ``world_size`` x steps is ``global_batch``; a
    global batch that is not a multiple is a :class:`UserError`."""
    denom = per_device * world_size
    if global_batch % denom:
        raise UserError(
            f"global_batch_size {global_batch} is not a multiple of per_device_train_batch_size {per_device} "
            f"x {world_size} processes"
        )
    return global_batch // denom


def plan_run(script_args, training_args, model_args) -> Plan:
    """Paths, flags, data, variant, batch and LoRA targets checked; the run's fingerprint computed."""
    check_model_path(model_args.model_name_or_path)
    check_output_paths(training_args)
    engine = engines.current_engine()
    with engines.said_once():
        engines.check_engine(engine, use_peft=model_args.use_peft, gpu=accelerator_available(),
                             cpu_bf16=training_args.cpu_bf16)
    checkpoints.check_start_flags(script_args, training_args)
    ds = load_pairs(script_args.dataset_name, script_args.dataset_train_split)
    data_info = check_variant(ds, script_args.variant, script_args.dataset_name)
    columns = ["prompt", "completion"]
    if getattr(script_args, "trainer", "sft") == "grpo":  # the reward reads each prompt's pool and target
        missing = [c for c in PROMPT_COLUMNS if c not in ds.column_names]
        if missing:
            raise UserError(f"dataset {script_args.dataset_name!r} has no {', '.join(missing)} column(s), which "
                            "trainer grpo needs: build it with `real-data pairs` (any variant)")
        columns = list(dict.fromkeys([*columns, *PROMPT_COLUMNS]))
    train_ds = ds.select_columns(columns)

    world_size = training_args.world_size
    if training_args.global_batch_size:
        problem = engines.batch_problem(engine, training_args.global_batch_size,
                                        training_args.per_device_train_batch_size)
        if problem and engine.num_processes == world_size:
            with engines.said_once():
                raise UserError(problem)
        acc = derive_accumulation(training_args.global_batch_size, training_args.per_device_train_batch_size,
                                  world_size)
        if acc != training_args.gradient_accumulation_steps:
            logger.warning("global_batch_size %d: gradient_accumulation_steps %d -> %d for %d process(es)",
                           training_args.global_batch_size, training_args.gradient_accumulation_steps, acc, world_size)
        training_args.gradient_accumulation_steps = acc
    global_batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world_size
    check_target_modules(model_args, training_args)
    data_sha = on_main_then_share(training_args, lambda: data_fingerprint(script_args.dataset_name),
                                  "the data's sha256")
    definition = fingerprint.run_definition(script_args=script_args, training_args=training_args,
                                            model_args=model_args, data_sha=data_sha, global_batch=global_batch)
    return Plan(train_ds, data_info, global_batch, data_sha, definition)


def build_trainer(script_args, training_args, model_args, *, callbacks: list | None = None,
                  plan: Plan | None = None) -> Run:
    """Check inputs (cheap checks first), check lengths and decide the start, then load the model and SFTTrainer."""
    from trl import SFTTrainer, get_peft_config

    plan = plan or plan_run(script_args, training_args, model_args)
    data_info = dict(plan.data_info)
    tokenizer = load_tokenizer(model_args, training_args)
    train_ds, lengths = enforce_max_length(plan.train_ds, tokenizer, training_args.max_length,
                                           drop_overlong=script_args.drop_overlong,
                                           data_path=str(script_args.dataset_name),
                                           num_proc=training_args.dataset_num_proc)
    data_info.update(longest_pair_tokens=lengths.longest, dropped_overlong=lengths.dropped)
    if lengths.dropped:
        logger.warning("drop_overlong: training on %d of %d pairs (%d longer than max_length %d tokens)",
                       lengths.kept, lengths.pairs, lengths.dropped, training_args.max_length)

    start = on_main_then_share(
        training_args, lambda: checkpoints.choose_start(script_args, training_args, plan.definition),
        "the resume decision")

    model = load_model(model_args, training_args)
    if cpu_loss.score_positions(training_args.cpu_scored_positions) and not accelerator_available():
        logger.info("cpu_scored_positions=%s: the fused LM head projects %s positions onto the vocabulary",
                    training_args.cpu_scored_positions,
                    "only the labelled" if training_args.cpu_scored_positions == "labelled" else "all")
    if engines.fsdp_on_cpu(engines.current_engine(), accelerator_available()):
        logger.info("FSDP on CPU ranks: accelerate's state marked multi-device so that its FSDP plugin applies")
    eos_ids = set_generation_eos(model, tokenizer)
    fae_eval = fae_eval_callback(script_args)  # FAE at each save when the recipe names fae_eval_records
    with fitted_for_padding_free(training_args, lengths):
        trainer = SFTTrainer(
            model=model,
            args=training_args,
            train_dataset=train_ds,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            callbacks=[fingerprint.RunDefinition(plan.definition), *(callbacks or []),
                       *([fae_eval] if fae_eval else [])],
        )
    if fae_eval:
        fae_eval.attach(trainer)
    if len(trainer.train_dataset) != lengths.kept:  # TRL dropped pairs our length check let through
        raise UserError(f"TRL kept {len(trainer.train_dataset)} of the {lengths.kept} pairs to train on; "
                        "some were dropped during its preparation (pass --debug and report it)")
    return Run(trainer, model, tokenizer, data_info, eos_ids, start.checkpoint, plan.global_batch, plan.data_sha,
               plan.definition)


def load_records_by_id(path: str | None) -> dict:
    """The on-policy trainer's claim records by id; no path, or a missing file, is a :class:`UserError`."""
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
    """``trainer: grpo``: TRL's ``GRPOTrainer`` built as :func:`build_trainer` builds ``SFTTrainer`` (the same
    checks, lengths, resume decision, model loading and callbacks), with the on-policy reward of
    :mod:`real.training.onpolicy` bound to the policy being trained."""
    from trl import GRPOTrainer

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
    if training_args.seeded_sampling:
        GRPOTrainer = seeded_sampling_trainer(GRPOTrainer)
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


def train(script_args, training_args, model_args, argv: list[str] | None = None) -> dict:
    """Train under an exclusive lock on output_dir (main process; the other ranks wait for it)."""
    check_output_paths(training_args)
    lock = RunLock(training_args.output_dir, "real-train", is_dir=True)
    set_stage(f"taking the lock on {training_args.output_dir}")
    on_main_then_share(training_args, lambda: lock.acquire() and None, f"the lock on {training_args.output_dir}")
    try:
        return _train_locked(script_args, training_args, model_args, argv)
    finally:
        lock.release()


def _finished_results(script_args, training_args, plan: Plan) -> dict | None:
    """The saved metrics when output_dir already holds this run's final model (nothing to train), else None."""
    done = on_main_then_share(training_args,
                              lambda: checkpoints.finished_start(script_args, training_args, plan.definition),
                              "whether output_dir already holds this finished run")
    if done is None:
        return None
    out = Path(training_args.output_dir)
    if training_args.process_index == 0:
        print(f"real-train: {out} already holds the finished model of this run (same base model, data and "
              "hyper-parameters); nothing to train (pass --start_over true to train it again)", flush=True)
    try:
        return json.loads((out / "train_results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _train_locked(script_args, training_args, model_args, argv) -> dict:
    again = resume_command(list(sys.argv[1:] if argv is None else argv))
    note = InterruptNote(training_args.output_dir, again, None)  # sets the Ctrl-C line
    set_stage("checking the data and the recipe")
    plan = plan_run(script_args, training_args, model_args)
    done = _finished_results(script_args, training_args, plan)
    if done is not None:
        set_interrupt_note(None)
        return done
    set_stage("loading the tokenizer and the model")
    build = build_grpo_trainer if getattr(script_args, "trainer", "sft") == "grpo" else build_trainer
    run = build(script_args, training_args, model_args, callbacks=[note, StageCallback()], plan=plan)
    trainer, resume = run.trainer, run.resume
    acc = trainer.accelerator
    acc.print(
        f"real-train: world size {acc.num_processes} (rank {acc.process_index}), per-device batch "
        f"{training_args.per_device_train_batch_size} x accumulation {training_args.gradient_accumulation_steps} "
        f"x {acc.num_processes} processes = global batch {run.global_batch}; {len(trainer.train_dataset)} pairs; "
        f"variant {script_args.variant}; device {acc.device}; engine {engine_name(acc)}"
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
    except RuntimeError as exc:  # a peer rank died mid-step: its collective fails here
        if acc.num_processes > 1 and run_stopping():  # the peer left because the run is stopped
            print(file=sys.stderr, flush=True)
            raise Terminated() from None
        if acc.num_processes > 1 and peer_lost(exc):
            print(file=sys.stderr, flush=True)
            last = checkpoints.last_complete_checkpoint(training_args.output_dir)
            kept = f"the last complete checkpoint ({last}) is kept" if last else "no checkpoint was saved yet"
            raise RunFailure(f"rank {acc.process_index} of {acc.num_processes}: another process of this run stopped "
                             f"during training ({_first_sentence(exc)}); see its error; {kept}; run the same "
                             f"command again to resume: {again}") from None
        raise
    set_interrupt_note(f"training finished but saving the final adapter to {training_args.output_dir} was cut "
                       f"short; run again to resume from the last checkpoint: {again}")
    set_stage(f"saving the adapter to {training_args.output_dir}")
    metrics = save_outputs(run, result, script_args, training_args, model_args)
    acc.print(f"real-train: saved to {training_args.output_dir}")
    # No rank leaves while another still works (the main process writes the model card; the FAE callback
    # runs there alone): a rank that left early would make the others' peer watch end them.
    set_stage("waiting for the other ranks at the end of the run")
    acc.wait_for_everyone()
    set_stage("closing the process group")
    acc.end_training()  # trackers finished, process group destroyed on every rank (Trainer.end does just this)
    set_interrupt_note(None)
    return metrics


class StageCallback(TrainerCallback):
    """Keeps :func:`real_fae_core.lifeline.set_stage` at the step being trained, for the line a stuck rank ends with."""

    def on_step_begin(self, args, state, control, **kwargs):
        """Say the step being trained (1-based, of ``max_steps``), for the line a stuck rank ends with."""
        set_stage(f"training step {state.global_step + 1} of {state.max_steps}")

    def on_save(self, args, state, control, **kwargs):
        """Say that checkpoint-N was just saved, for the line a stuck rank ends with."""
        set_stage(f"after saving checkpoint-{state.global_step}")


def engine_name(accelerator) -> str:
    """How the ranks share the model: ddp, deepspeed-zero<stage>, fsdp<version>, or single (one process)."""
    kind = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    if kind == "DEEPSPEED":
        return f"deepspeed-zero{accelerator.state.deepspeed_plugin.zero_stage}"
    if kind == "FSDP":
        return f"fsdp{accelerator.state.fsdp_plugin.fsdp_version}"
    return "single" if accelerator.num_processes == 1 else "ddp"


def per_rank_memory(trainer) -> list[dict]:
    """Each rank's parameter / optimizer-state bytes and peak RSS (rank order), measured at the end of training."""
    import torch.distributed as dist

    mine = dict(rank=trainer.accelerator.process_index,
                **engines.local_memory(trainer.model, getattr(trainer, "optimizer", None)))
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [mine]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return sorted(every, key=lambda m: m["rank"])


def save_outputs(run: Run, result, script_args, training_args, model_args) -> dict:
    """The final adapter, metrics, state, tokenizer, resolved config, model card; the fingerprint last."""
    import peft
    import torch
    import transformers
    import trl
    import yaml

    trainer, data_info = run.trainer, run.data_info
    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    metrics = dict(result.metrics)
    metrics["per_rank_memory"] = per_rank_memory(trainer)
    metrics.update(train_samples=len(trainer.train_dataset), pairs_in_dataset=data_info["pairs"],
                   pairs_dropped_overlong=data_info.get("dropped_overlong", 0),
                   world_size=trainer.accelerator.num_processes, global_batch_size=run.global_batch)
    if run.resume:
        metrics["resumed_from"] = str(run.resume)
    trainer.log_metrics("train", {k: v for k, v in metrics.items() if k != "per_rank_memory"})
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    if trainer.is_world_process_zero():
        run.model.generation_config.eos_token_id = run.eos_ids
        run.model.generation_config.save_pretrained(str(out))
        run.tokenizer.save_pretrained(str(out))
        cfg = resolved_config(script_args, training_args, model_args)
        atomic_write_text(out / "resolved_config.yaml", yaml.safe_dump(cfg, sort_keys=True))
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "trl": trl.__version__, "peft": peft.__version__}
        card = model_card(base_model=model_args.model_name_or_path, variant=script_args.variant,
                          data_path=os.path.abspath(script_args.dataset_name), data_info=data_info,
                          data_sha=run.data_sha or data_fingerprint(script_args.dataset_name), args=training_args,
                          model_args=model_args, metrics=metrics, versions=versions)
        atomic_write_text(out / "README.md", card)
        if run.definition is not None:
            fingerprint.write_finished(out, run.definition)
    return metrics
