"""FAE while training: a small ablation run on a dev subset at every checkpoint save, logged by the Trainer.

:class:`FaeEvalCallback` evaluates the model being trained, in memory (no
reload), with the FAE engine of ``fae run`` (:func:`fae.ablation.engine.ablate`
over the hf backend), and logs ``fae/acc``, ``fae/is``, ``fae/er`` (and
``fae/io``, ``fae/nei_rate_r1``, ``fae/valid_rate``) through ``trainer.log``:
they land in ``trainer_state.json``'s ``log_history`` and in every
``report_to`` integration (TensorBoard, W&B) like the loss. Recipes turn it on
with ``fae_eval_records`` (docs/training.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import yaml
from transformers import TrainerCallback

from real_fae_core.errors import UserError
from real_fae_core.flags import UNTIL
from data_prep.records import RecordError, load_records
from fae.ablation.checkpoints import checkpoint_row
from fae.ablation.engine import ablate
from fae.ablation.metrics import compute_metrics
from fae.ablation.runner import FaeRunConfig
from fae.ablation.population import fae_claims
from fae.backends import ANSWER_MAX_NEW_TOKENS
from fae.backends.hf import HFBackend

logger = logging.getLogger("real.train")


class FaeEvalCallback(TrainerCallback):
    """At each save: FAE of the current weights on the first ``limit`` claims of ``records``.

    Runs on the main process only (greedy, eval mode, no gradients; train
    mode restored afterwards); the other processes wait at their next step.
    Not for DeepSpeed ZeRO-3, whose weights are sharded across processes.
    Call :meth:`attach` with the trainer before training: logging goes through it.
    """

    def __init__(self, records: str, limit: int | None = 20, rounds: int = 2, max_new_tokens: int = ANSWER_MAX_NEW_TOKENS,
                 batch_size: int = 8, constrained_decoding: bool = False, label_probs: bool = False):
        try:
            claims, _ = fae_claims(load_records(records), source=records)
        except RecordError as exc:
            raise UserError(f"fae_eval_records: {exc}") from None
        self.records = claims[:limit] if limit else claims
        if not self.records:
            raise UserError(f"fae_eval_records {records}: no SUPPORT/REFUTE claims to evaluate")
        self.rounds = int(rounds)
        self.options = {"max_new_tokens": int(max_new_tokens), "batch_size": int(batch_size),
                        "constrained_decoding": bool(constrained_decoding), "label_probs": bool(label_probs)}
        self.trainer = None

    def attach(self, trainer) -> FaeEvalCallback:
        """Give the callback the trainer it logs through (itself, for chaining); needed before training starts."""
        self.trainer = trainer
        return self

    def evaluate(self, model, tokenizer) -> dict:
        """The FAE metrics of ``model`` now (``compute_metrics``); its train/eval mode is left as found."""
        import torch

        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                backend = HFBackend(self.options, loaded=(model, tokenizer))
                claims = ablate(self.records, backend, self.rounds)
        finally:
            model.train(was_training)
        return compute_metrics(claims)

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        """At each save, on the main process only: FAE of the model as saved, logged as ``fae/*`` through the
        trainer; RuntimeError when :meth:`attach` was not called."""
        if not state.is_world_process_zero:
            return
        if self.trainer is None:
            raise RuntimeError("FaeEvalCallback.attach(trainer) was not called")
        t0 = time.perf_counter()
        row = checkpoint_row(self.evaluate(model, processing_class or self.trainer.processing_class))
        logs = {f"fae/{k.lower()}": float(v) for k, v in row.items() if v is not None}
        logs["fae/seconds"] = round(time.perf_counter() - t0, 3)
        logger.info("FAE at step %d on %d claims: %s", state.global_step, len(self.records), logs)
        self.trainer.log(logs)


# The `fae run` options the FAE at each save reads (it evaluates the model being trained, in memory: no
# model, adapter, device or output of its own), with the callback's defaults where they differ from fae run's.
EVAL_OPTIONS = {"limit": 20, "rounds": 2, "max_new_tokens": ANSWER_MAX_NEW_TOKENS, "batch_size": 8, "constrained_decoding": False,
                "label_probs": False}
DEPRECATED_KEYS = {"fae_eval_limit": "limit", "fae_eval_rounds": "rounds",
                   "fae_eval_max_new_tokens": "max_new_tokens",
                   "fae_eval_constrained_decoding": "constrained_decoding"}


def eval_options(script_args) -> FaeRunConfig:
    """The FAE-at-each-save options as `fae run` options: ``fae_eval`` (a mapping, or KEY=VALUE,... from the
    command line) over :data:`EVAL_OPTIONS`, checked by `fae run`'s own option class. The old
    ``fae_eval_<key>`` fields still count, with a warning, until 0.2; a key given both ways is an error."""
    given = parse_pairs(getattr(script_args, "fae_eval", None))
    for old, key in DEPRECATED_KEYS.items():
        value = getattr(script_args, old, None)
        if value is None:
            continue
        logger.warning("%s is deprecated; use fae_eval: {%s: %s} (accepted until %s)", old, key, value, UNTIL)
        if key in given:
            raise UserError(f"fae_eval: {key} is also given as {old}; keep fae_eval: {{{key}: ...}}")
        given[key] = value
    for key in given:
        if key not in EVAL_OPTIONS:
            known = {f.name for f in dataclasses.fields(FaeRunConfig)}
            why = ("is a `fae run` option the FAE at each save does not read (it evaluates the model being "
                   "trained, in memory)" if key in known else "is not a `fae run` option")
            raise UserError(f"fae_eval: {key} {why}; its options: {', '.join(EVAL_OPTIONS)}")
    values = {**EVAL_OPTIONS, **given, "records": script_args.fae_eval_records}
    return FaeRunConfig.from_mapping(values, source="fae_eval")


def parse_pairs(value) -> dict:
    """``fae_eval`` as a dict: a YAML mapping as it is, ``KEY=VALUE,...`` read value by value as YAML."""
    if not value:
        return {}
    if isinstance(value, dict):
        return dict(value)
    out = {}
    for item in (i for i in str(value).split(",") if i.strip()):
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"fae_eval: {item!r} is not KEY=VALUE (give KEY=VALUE,KEY=VALUE)")
        value = yaml.safe_load(raw) if raw.strip() else ""
        if out.setdefault(key.strip(), value) != value:
            raise UserError(f"fae_eval: {key.strip()} given twice with two values (give it once)")
    return out


def fae_eval_callback(script_args) -> FaeEvalCallback | None:
    """The callback a recipe asks for with ``fae_eval_records`` (None without it)."""
    records = getattr(script_args, "fae_eval_records", None)
    if not records:
        if getattr(script_args, "fae_eval", None):
            raise UserError("fae_eval is set but fae_eval_records is not: name the claims to evaluate")
        return None
    opts = eval_options(script_args)
    return FaeEvalCallback(records, limit=opts.limit, rounds=opts.rounds, max_new_tokens=opts.max_new_tokens,
                           batch_size=opts.batch_size, constrained_decoding=opts.constrained_decoding,
                           label_probs=opts.label_probs)
