"""FAE while training: a small ablation run on a dev subset at every checkpoint save, logged by the Trainer.

:class:`FaeEvalCallback` evaluates the model being trained, in memory (no
reload), with the FAE engine of ``fae run`` (:func:`fae.ablation.engine.ablate_chunk`
over the hf backend), and logs ``fae/acc``, ``fae/is``, ``fae/er`` (and
``fae/io``, ``fae/nei_rate_r1``, ``fae/valid_rate``) through ``trainer.log``:
they land in ``trainer_state.json``'s ``log_history`` and in every
``report_to`` integration (TensorBoard, W&B) like the loss. Recipes turn it on
with ``fae_eval_records`` (docs/training.md).
"""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

from real_fae_core.errors import UserError
from data_prep.records import RecordError, load_records
from fae.ablation.checkpoints import checkpoint_row
from fae.ablation.engine import ablate_chunk
from fae.ablation.metrics import compute_metrics
from fae.ablation.population import fae_claims
from fae.backends.hf import HFBackend

logger = logging.getLogger("real.train")


class FaeEvalCallback(TrainerCallback):
    """At each save: FAE of the current weights on the first ``limit`` claims of ``records``.

    Runs on the main process only (greedy, eval mode, no gradients; train
    mode restored afterwards); the other processes wait at their next step.
    Not for DeepSpeed ZeRO-3, whose weights are sharded across processes.
    Call :meth:`attach` with the trainer before training: logging goes through it.
    """

    def __init__(self, records: str, limit: int | None = 20, rounds: int = 2, max_new_tokens: int = 64,
                 batch_size: int = 8, constrained_decoding: bool = False):
        try:
            claims, _ = fae_claims(load_records(records), source=records)
        except RecordError as exc:
            raise UserError(f"fae_eval_records: {exc}") from None
        self.records = claims[:limit] if limit else claims
        if not self.records:
            raise UserError(f"fae_eval_records {records}: no SUPPORT/REFUTE claims to evaluate")
        self.rounds = int(rounds)
        self.options = {"max_new_tokens": int(max_new_tokens), "batch_size": int(batch_size),
                        "constrained_decoding": bool(constrained_decoding), "label_probs": False}
        self.trainer = None

    def attach(self, trainer) -> FaeEvalCallback:
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
                claims = ablate_chunk(self.records, backend, self.rounds)
        finally:
            model.train(was_training)
        return compute_metrics(claims)

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
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


def fae_eval_callback(script_args) -> FaeEvalCallback | None:
    """The callback a recipe asks for with ``fae_eval_records`` (None without it)."""
    records = getattr(script_args, "fae_eval_records", None)
    if not records:
        return None
    return FaeEvalCallback(records, limit=script_args.fae_eval_limit, rounds=script_args.fae_eval_rounds,
                           max_new_tokens=script_args.fae_eval_max_new_tokens,
                           constrained_decoding=script_args.fae_eval_constrained_decoding)
