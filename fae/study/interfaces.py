"""Answer interfaces of the evaluation-choice study (SPEC §10): what the verifier is asked to write, and
how its answer is read.

Two interfaces beside the JSON answer of SPEC §3, both without citations:

- ``codes``: exactly one of ``A``, ``B``, ``C``, standing for the dataset's three labels (in the order
  SUPPORT, REFUTE, NOT_ENOUGH_INFO unless a control permutes them);
- ``labels``: exactly one label string of the benchmark itself (FEVER ``SUPPORTS`` / ``REFUTES`` /
  ``NOT ENOUGH INFO``, SciFact ``SUPPORT`` / ``CONTRADICT`` / ``NOT_ENOUGH_INFO``, Check-COVID
  ``SUPPORT`` / ``REFUTE`` / ``NOTENOUGHINFO``, the strings of its released files).

An answer is read strictly, as the paper reads it: surrounding whitespace is stripped and what is left
must equal one of the three strings, case included. Anything else is :data:`INVALID`: kept with the
response and scored wrong, never guessed. Answers are at most 16 new tokens (``max_new_tokens``).

The lenient reader (:meth:`AnswerFormat.parse_lenient`, the paper's alternative parser of Appendix I) is a
sensitivity check of the report, never the study's reader: it re-reads a saved raw response without
consulting gold, folding case, spaces/underscores/hyphens, surrounding punctuation, quotes and markdown, an
``Answer:`` lead, and accepting a leading label or code followed by an explanation only when that
explanation names no other choice and holds no question, uncertainty or negation marker.

The prompt puts the evidence before the format instruction: the conditions of one unit (two formats,
six replicates, and the shorter budget's evidence, a prefix of the longer one's) then share the longest
possible token prefix, which a server's prefix cache reuses.

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
