"""The evaluation-choice study's answer interfaces (SPEC §10): the prompt, the admissible answers, the strict
reader. The one definition, shared by the study (:mod:`fae.study.interfaces` re-exports it) and the
format-tuning pairs (``real-data pairs --interface codes|labels|study``), which must render the same prompt
and train on the same answer strings the study reads; it lives in ``data_prep`` because ``data_prep`` never
imports ``fae`` (docs/architecture.md).

Two interfaces beside the JSON answer of SPEC §3, both without citations:

- ``codes``: exactly one of ``A``, ``B``, ``C``, standing for the dataset's three labels (in the order
  SUPPORT, REFUTE, NOT_ENOUGH_INFO unless a control permutes them);
- ``labels``: exactly one label string of the benchmark itself (FEVER ``SUPPORTS`` / ``REFUTES`` /
  ``NOT ENOUGH INFO``, SciFact ``SUPPORT`` / ``CONTRADICT`` / ``NOT_ENOUGH_INFO``, Check-COVID
  ``SUPPORT`` / ``REFUTE`` / ``NOTENOUGHINFO``, the strings of its released files).

An answer is read strictly (:meth:`AnswerFormat.parse`): surrounding whitespace is stripped and what is
left must equal one of the three strings, case included; anything else is :data:`INVALID`. The lenient
reader (:meth:`AnswerFormat.parse_lenient`) is the report's sensitivity check, never the study's reader.
What each answer stands for is in :mod:`fae.study.interfaces`' docstring and docs/study.md.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from real_fae_core.errors import UserError
from real_fae_core.labels import LABELS, NOT_ENOUGH_INFO, REFUTE, SUPPORT
from data_prep.prompts import Message, format_lines, number_lines, one_line

INVALID = "INVALID"  # an answer that is none of the three strings (kept, scored wrong)
ANSWER_TOKENS = 16  # the paper's output limit: room for a label string, not for an explanation
STUDY_LINE_IDS = "renumbered"  # no citations are asked: numbers in shown order leave sources differing in order only

STUDY_SYSTEM_PROMPT = (
    "Verify the claim strictly against the provided evidence. "
    "If the evidence neither supports nor refutes the claim, there is not enough information."
)
# What each label means, in the instruction of either interface.
LABEL_MEANINGS = {
    SUPPORT: "the evidence supports the claim",
    REFUTE: "the evidence refutes the claim",
    NOT_ENOUGH_INFO: "there is not enough information",
}


# The lenient reader's normalisation (Appendix I): what may surround an answer, an answer lead, and what in an
# explanation after a leading answer makes it ambiguous (a question, uncertainty, negation, another choice).
LENIENT_SURROUNDING = " \t\r\n\"'`*_#.,:;!()[]{}<>\u201c\u201d\u2018\u2019"
LENIENT_LEAD = re.compile(r"^(?:the\s+)?(?:final\s+)?(?:answer|label|verdict)(?:\s+is)?\s*[:=\-]?\s*", re.IGNORECASE)
LENIENT_AMBIGUOUS = re.compile(r"\?|\b(?:not|no|never|cannot|can't|isn't|doesn't|unsure|uncertain|unclear|maybe|"
                               r"perhaps|possibly|probably|might|either|neither|or)\b", re.IGNORECASE)


def _lenient_key(text: str) -> str:
    """Case folded, spaces, underscores and hyphens removed: ``Not enough info`` = ``NOT_ENOUGH_INFO``."""
    return re.sub(r"[\s_\-]+", "", text.casefold())


class Unit(Protocol):
    """A unit of evidence as shown: :class:`data_prep.records.Sentence` is one."""

    id: int
    text: str
    doc: str | None


@dataclass(frozen=True)
class StudyDataset:
    """What the study needs of a dataset: its label strings and how much visible evidence is submitted.

    ``label_strings`` maps the project's labels (:mod:`real_fae_core.labels`) to the benchmark's own.
    ``submitted`` units are submitted for scoring: the first ones shown overall, or, ``per_document``,
    the first ones of each document (SciFact scores at most three rationale sentences per abstract).
    """

    name: str
    label_strings: Mapping[str, str]
    submitted: int
    per_document: bool


# Check-COVID is not in the paper. Retrieval gives it one pool per claim over five abstracts, as for
# Wikipedia (SPEC §10), and its gold is one group of sentences (FEVER semantics), so it is submitted like
# FEVER (the first five units); its label strings are its released files'.
DATASETS: dict[str, StudyDataset] = {
    "fever": StudyDataset("fever", {SUPPORT: "SUPPORTS", REFUTE: "REFUTES", NOT_ENOUGH_INFO: "NOT ENOUGH INFO"},
                          submitted=5, per_document=False),
    "scifact": StudyDataset("scifact", {SUPPORT: "SUPPORT", REFUTE: "CONTRADICT",
                                        NOT_ENOUGH_INFO: "NOT_ENOUGH_INFO"}, submitted=3, per_document=True),
    "check-covid": StudyDataset("check-covid", {SUPPORT: "SUPPORT", REFUTE: "REFUTE",
                                                NOT_ENOUGH_INFO: "NOTENOUGHINFO"}, submitted=5, per_document=False),
}


def study_dataset(name: str) -> StudyDataset:
    """The study's view of dataset ``name`` (a record's ``dataset`` field); one line of bad input else."""
    if name not in DATASETS:
        raise UserError(f"dataset {name!r} has no label strings for the evaluation-choice study "
                        f"(known: {', '.join(DATASETS)})")
    return DATASETS[name]


def _or_list(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + f" or {items[-1]}" if len(items) > 1 else "".join(items)


@dataclass(frozen=True)
class AnswerFormat:
    """One answer interface: its choices per dataset, the instruction that asks for them, the strict reader."""

    name: str = ""
    max_new_tokens: int = ANSWER_TOKENS

    def answers(self, dataset: str) -> dict[str, str]:
        """Each admissible answer string -> the project's label it stands for."""
        raise NotImplementedError

    def answer(self, label: str, dataset: str) -> str:
        """The exact answer string that stands for the project's ``label`` (a format-tuning target):
        :meth:`parse` reads it back as ``label``."""
        strings = [text for text, meant in self.answers(dataset).items() if meant == label]
        if len(strings) != 1:
            raise ValueError(f"label {label!r}: not one of {', '.join(LABELS)}")
        return strings[0]

    def instruction(self, dataset: str) -> str:
        """The format instruction: the choices, then what each one means."""
        choices = self.answers(dataset)
        meanings = "; ".join(f"{text} if {LABEL_MEANINGS[label]}" for text, label in choices.items())
        return f"Answer with exactly one of {_or_list(list(choices))} and nothing else: {meanings}."

    def parse(self, text: Any, dataset: str) -> str:
        """The project's label that ``text`` names after stripping whitespace, else :data:`INVALID`."""
        answers = self.answers(dataset)
        return answers.get(text.strip(), INVALID) if isinstance(text, str) else INVALID

    def parse_lenient(self, text: Any, dataset: str) -> str:
        """The paper's alternative reading of a raw response (a sensitivity check; :meth:`parse` is the
        study's reader): what :meth:`parse` reads, else the choice the text names after folding case,
        spaces/underscores/hyphens, surrounding punctuation, quotes and markdown and an ``Answer:`` lead, else
        one leading choice followed by an explanation that names no other choice and holds no question,
        uncertainty or negation marker; anything else stays :data:`INVALID`. Gold is never consulted."""
        strict = self.parse(text, dataset)
        if strict != INVALID or not isinstance(text, str):
            return strict
        answers = self.answers(dataset)
        body = LENIENT_LEAD.sub("", text.strip(LENIENT_SURROUNDING), count=1).strip(LENIENT_SURROUNDING)
        if not body:
            return INVALID
        whole = {_lenient_key(choice): label for choice, label in answers.items()}
        if _lenient_key(body) in whole:
            return whole[_lenient_key(body)]
        leading = [(m, label) for choice, label in answers.items()
                   if (m := re.match(self._leading(choice), body, re.IGNORECASE))]
        if len({label for _, label in leading}) != 1:
            return INVALID
        m, label = leading[0]
        rest = body[m.end():]
        others = [choice for choice, other in answers.items() if other != label]
        if LENIENT_AMBIGUOUS.search(rest) or any(re.search(self._mention(c), rest) for c in others):
            return INVALID
        return label

    @staticmethod
    def _leading(choice: str) -> str:
        """A choice at the start of a text, its words joined by any spaces/underscores/hyphens, ending at a
        word boundary; a one-letter code must be followed by the end, a line break or ``.``, ``)``, ``:``,
        ``,``, ``-`` (so the article in ``A claim ...`` is no code)."""
        words = r"[\s_\-]*".join(re.escape(w) for w in re.split(r"[\s_]+", choice))
        if len(choice) == 1:
            return rf"^{words}(?=\s*$|\s*[.):,\-]|[ \t]*\n)"
        return rf"^{words}(?![A-Za-z0-9])"

    @staticmethod
    def _mention(choice: str) -> str:
        """Another choice named in an explanation: a code as a capital letter standing alone, a label string
        as words in any case."""
        if len(choice) == 1:
            return rf"(?<![A-Za-z0-9]){re.escape(choice)}(?![A-Za-z0-9])"
        return "(?i)(?<![A-Za-z0-9])" + r"[\s_\-]*".join(re.escape(w) for w in re.split(r"[\s_]+", choice)) + \
            "(?![A-Za-z0-9])"


@dataclass(frozen=True)
class CodesFormat(AnswerFormat):
    """``codes``: A, B or C. ``order`` is the labels they stand for (a permuted one is a SPEC §10 control)."""

    name: str = "codes"
    order: tuple[str, ...] = field(default=LABELS)

    def __post_init__(self):
        if sorted(self.order) != sorted(LABELS):
            raise ValueError(f"codes order {self.order!r}: a permutation of {', '.join(LABELS)}")

    def answers(self, dataset: str) -> dict[str, str]:
        """Each code (A, B, C) to the label it stands for in this ``order``; an unknown dataset is refused."""
        study_dataset(dataset)  # the codes are the same everywhere, the dataset must still be known
        return dict(zip("ABC", self.order))


@dataclass(frozen=True)
class LabelsFormat(AnswerFormat):
    """``labels``: the benchmark's own label strings."""

    name: str = "labels"

    def answers(self, dataset: str) -> dict[str, str]:
        """The dataset's label strings to the labels (its own spelling of each); an unknown dataset is refused."""
        strings = study_dataset(dataset).label_strings
        return {strings[label]: label for label in LABELS}


FORMATS: dict[str, AnswerFormat] = {"codes": CodesFormat(), "labels": LabelsFormat()}


def answer_format(name: str) -> AnswerFormat:
    """The interface called ``name``; one line of bad input else."""
    if name not in FORMATS:
        raise UserError(f"answer format {name!r}: choose {' or '.join(FORMATS)}")
    return FORMATS[name]


def render_study_prompt(claim: str, units: Sequence[Unit], fmt: AnswerFormat, dataset: str,
                        line_ids: str = STUDY_LINE_IDS) -> list[Message]:
    """Chat messages for one condition: the claim, the evidence ``units`` in the order shown, then ``fmt``'s
    instruction.

    The system message is the same for every claim; the user message holds ``Claim:``, ``Document:`` and
    one ``lineN: text`` row per unit (:func:`data_prep.prompts.format_lines`), and the format instruction
    last, so the conditions of one unit share their prefix up to it. The backend applies the model's chat
    template, as for every prompt (SPEC §3).
    """
    ids = [u.id for u in units]
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    if repeated:
        raise ValueError(f"unit ids {sorted(repeated)} shown twice")
    rows = format_lines(number_lines(ids, line_ids), {u.id: u.text for u in units})
    user = f"Claim: {one_line(claim)}\nDocument:\n{rows}\n\n{fmt.instruction(dataset)}"
    return [{"role": "system", "content": STUDY_SYSTEM_PROMPT}, {"role": "user", "content": user}]
