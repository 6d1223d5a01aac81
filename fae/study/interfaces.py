"""Answer interfaces of the evaluation-choice study (SPEC §10): the prompt, the two bare answer formats
(``codes``, ``labels``), their strict and lenient readers are defined once in :mod:`data_prep.study_prompts`
(the format-tuning pairs render the same) and re-exported here for the study.

The evidence submitted for scoring is a prefix of the evidence shown (:func:`submitted_evidence`), so a
larger budget can change both what the model reads and what is scored.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

# The prompt, the answers and the strict and lenient readers are defined once in data_prep.study_prompts
# (training pairs render the same prompts; data_prep never imports fae) and are this module's public names.
from data_prep.study_prompts import (
    ANSWER_TOKENS,
    DATASETS,
    FORMATS,
    INVALID,
    LABEL_MEANINGS,
    LENIENT_AMBIGUOUS,
    LENIENT_LEAD,
    LENIENT_SURROUNDING,
    STUDY_LINE_IDS,
    STUDY_SYSTEM_PROMPT,
    AnswerFormat,
    CodesFormat,
    LabelsFormat,
    StudyDataset,
    Unit,
    answer_format,
    render_study_prompt,
    study_dataset,
)

__all__ = ["ANSWER_TOKENS", "DATASETS", "FORMATS", "INVALID", "LABEL_MEANINGS", "LENIENT_AMBIGUOUS", "LENIENT_LEAD",
           "LENIENT_SURROUNDING", "STUDY_LINE_IDS", "STUDY_SYSTEM_PROMPT", "AnswerFormat", "CodesFormat",
           "LabelsFormat", "StudyDataset", "Unit", "answer_format", "render_study_prompt", "study_dataset",
           "submitted_evidence"]


def submitted_evidence(visible_units: Sequence[Unit], dataset: str) -> list[int]:
    """The ids submitted for scoring: the SPEC §10 prefix of the units shown, in the order shown.

    FEVER: the first 5 units. SciFact: the first 3 units of each abstract (``doc``), its scorer's cap on
    rationale sentences. Check-COVID: as FEVER (one pool per claim, a FEVER-style gold group).
    """
    spec = study_dataset(dataset)
    if not spec.per_document:
        return [u.id for u in visible_units[:spec.submitted]]
    taken: Counter = Counter()
    out = []
    for u in visible_units:
        if taken[u.doc] < spec.submitted:
            taken[u.doc] += 1
            out.append(u.id)
    return out
