"""``inspect eval real_fae/fae``: the task Inspect AI finds through this package's ``inspect_ai`` entry point."""

from __future__ import annotations

from typing import Any

from inspect_ai import Task, task
from inspect_ai.util import registry_info

from real_fae_core.errors import UserError
from fae.ablation.engine import DEFAULT_ARMS
from fae.harness.inspect_internals import PrerequisiteError, active_model
from fae.harness.inspect_task import DEFAULT_MAX_TOKENS, TASK_NAME, fae_task


# Inspect AI reads a task's options from its signature, so each arm is a parameter; its default is fae run's
# (fae.ablation.engine.Arms, the one declaration), and fae_task checks the values with Arms' own check.
def fae_options(records: str | None = None, rounds: int = 4, max_tokens: int = DEFAULT_MAX_TOKENS,
                control: str = DEFAULT_ARMS.control, control_seed: int = DEFAULT_ARMS.control_seed,
                gold_only: bool = DEFAULT_ARMS.gold_only, cited_only: bool = DEFAULT_ARMS.cited_only,
                size_sweep: bool = DEFAULT_ARMS.size_sweep, sweep_seed: int = DEFAULT_ARMS.sweep_seed,
                line_ids: str = DEFAULT_ARMS.line_ids, **unknown: Any) -> Task:
    """Fact-Ablated Evaluation (SPEC §6) of the model under evaluation on a records file (SPEC §2).

    Args:
      records: the claim records (.jsonl); required.
      rounds: R, the ablation rounds after round 0 (fae run's --rounds).
      max_tokens: the answer length cap (fae run's --max-new-tokens).
      control: matched (the control arm, matched on the gap; IS_ctrl), random or none (fae run's --control).
      control_seed: the control's seed (fae run's --control-seed).
      gold_only: also ask each claim on its gold sentences alone (fae run's --gold-only).
      cited_only: also ask each claim on the lines its round-0 answer cited, alone (fae run's --cited-only).
      size_sweep: also ask each claim on its gold lines plus k other lines (fae run's --size-sweep).
      sweep_seed: the size sweep's seed (fae run's --sweep-seed).
      line_ids: original or renumbered line numbers (fae run's --line-ids).
    """
    try:
        return fae_task(records, rounds=rounds, max_tokens=max_tokens, unknown=unknown, model=active_model(),
                        control=control, control_seed=control_seed, gold_only=gold_only, cited_only=cited_only,
                        size_sweep=size_sweep, sweep_seed=sweep_seed, line_ids=line_ids)
    except UserError as exc:  # bad input: one line, no traceback
        raise PrerequisiteError(f"{TASK_NAME}: error: {exc}") from None


# Inspect prefixes a task's name with the installed package that defines it. Where it cannot tell
# (a source checkout on sys.path ahead of the installed metadata, as under pytest), the name is
# given in full, so the task is real_fae/fae wherever it is loaded from.
fae = task(name="fae")(fae_options)
if registry_info(fae).name != TASK_NAME:
    fae = task(name=TASK_NAME)(fae_options)
