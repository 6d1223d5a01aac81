"""Pair lengths against ``max_length``, measured exactly as TRL will tokenize them.

TRL's ``SFTTrainer`` cuts every sequence at ``max_length`` (keeping the start)
and then drops the ones whose answer was cut away entirely, without a word: a
run over 24 pairs trains on 10 while the model card says 24; the survivors may
train on a clipped answer. The check here runs before any model loads: it
refuses such a dataset with the counts and the fix, or, with ``drop_overlong``,
removes exactly the pairs that do not fit so nothing is ever truncated.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from real_fae_core.errors import UserError


def _lengths(batch, tokenizer) -> dict:
    # = trl.trainer.sft_trainer.tokenize_fn for conversational prompt-completion rows:
    # apply_chat_template(prompt + completion, tokenize=True) without a generation prompt.
    convs = [p + c for p, c in zip(batch["prompt"], batch["completion"])]
    ids = tokenizer.apply_chat_template(convs, tokenize=True, return_dict=True)["input_ids"]
    return {"n_train_tokens": [len(x) for x in ids]}


def pair_lengths(dataset, tokenizer, num_proc: int | None = None) -> list[int]:
    """Tokens per pair (prompt + completion through the chat template), in dataset order."""
    measured = dataset.map(_lengths, batched=True, batch_size=256, fn_kwargs={"tokenizer": tokenizer},
                           remove_columns=dataset.column_names, keep_in_memory=True, num_proc=num_proc,
                           desc="Measuring pair lengths")
    return list(measured["n_train_tokens"])


@dataclass
class LengthCheck:
    pairs: int  # in the dataset
    kept: int  # trained on
    dropped: int  # longer than max_length (only with drop_overlong)
    longest: int
    max_length: int | None


def enforce_max_length(dataset, tokenizer, max_length: int | None, *, drop_overlong: bool, data_path: str,
                       num_proc: int | None = None):
    """(dataset to train on, LengthCheck); refuses over-long pairs unless ``drop_overlong``."""
    if max_length is None:
        return dataset, LengthCheck(len(dataset), len(dataset), 0, 0, None)
    lengths = pair_lengths(dataset, tokenizer, num_proc)
    over = [i for i, n in enumerate(lengths) if n > max_length]
    longest = max(lengths) if lengths else 0
    if over and not drop_overlong:
        raise UserError(
            f"dataset {data_path!r}: {len(over)} of {len(dataset)} pairs are longer than max_length {max_length} "
            f"tokens (the longest has {longest}); TRL would truncate them and drop those whose answer is cut "
            f"off; raise max_length to at least {longest}, rebuild the pairs with `real-data pairs --max-length "
            f"{max_length}`, or set drop_overlong: true to train without them"
        )
    if over:
        drop = set(over)
        dataset = dataset.select([i for i in range(len(dataset)) if i not in drop])
        if len(dataset) == 0:
            raise UserError(f"dataset {data_path!r}: all {len(lengths)} pairs are longer than max_length "
                            f"{max_length} tokens (the longest has {longest}); raise max_length")
    return dataset, LengthCheck(len(lengths), len(dataset), len(over), longest, max_length)


@contextmanager
def fitted_for_padding_free(training_args, lengths: LengthCheck):
    """While ``SFTTrainer`` is built: ``max_length`` off when TRL would refuse it and the pairs already fit.

    TRL refuses ``padding_free`` without packing while ``max_length`` is set, because that path would not
    truncate ("provide already truncated inputs, or set max_length=None"). Every pair here was measured
    against ``max_length`` by :func:`enforce_max_length` (over-long ones refused or dropped), so there is
    nothing to truncate: TRL gets ``max_length=None`` while it prepares the data, and the value is put back
    for everything after (the checkpoints' training arguments, the model card, the resume fingerprint)."""
    if not (getattr(training_args, "padding_free", False) and not training_args.packing
            and training_args.max_length is not None):
        yield
        return
    if lengths.max_length != training_args.max_length or lengths.longest > training_args.max_length:
        raise AssertionError("padding_free: the pairs were not checked against this max_length")
    saved = training_args.max_length
    training_args.max_length = None
    try:
        yield
    finally:
        training_args.max_length = saved
