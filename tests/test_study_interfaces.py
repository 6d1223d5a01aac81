"""The study's answer interfaces (SPEC §10): strict readers, each dataset's strings, the prompt, the submitted prefix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_fae_core.errors import UserError
from real_fae_core.labels import LABELS, NOT_ENOUGH_INFO, REFUTE, SUPPORT
from data_prep.converters import check_covid, fever, scifact
from data_prep.records import Sentence
from fae.study.interfaces import (
    DATASETS,
    FORMATS,
    INVALID,
    CodesFormat,
    answer_format,
    render_study_prompt,
    submitted_evidence,
    study_dataset,
)

CODES, LABEL_STRINGS = FORMATS["codes"], FORMATS["labels"]
WHITESPACE = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003\u3000", max_size=5)
DATASET = st.sampled_from(sorted(DATASETS))
FORMAT = st.sampled_from(sorted(FORMATS))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=30), dataset=DATASET, name=FORMAT)
def test_only_an_exact_answer_after_stripping_parses(text, dataset, name):
    fmt = FORMATS[name]
    answers = fmt.answers(dataset)
    expected = answers.get(text.strip(), INVALID)
    assert fmt.parse(text, dataset) == expected
    assert (expected == INVALID) == (text.strip() not in answers)


@settings(max_examples=200, deadline=None)
@given(before=WHITESPACE, after=WHITESPACE, dataset=DATASET, name=FORMAT, data=st.data())
def test_whitespace_around_an_answer_is_forgiven(before, after, dataset, name, data):
    fmt = FORMATS[name]
    answer, label = data.draw(st.sampled_from(sorted(fmt.answers(dataset).items())))
    assert fmt.parse(before + answer + after, dataset) == label


@settings(max_examples=200, deadline=None)
@given(dataset=DATASET, name=FORMAT, data=st.data(),
       extra=st.sampled_from([".", "!", " because", "\nThe evidence says so.", '"', "*", ")"]))
def test_case_changes_and_anything_more_are_invalid(dataset, name, data, extra):
    fmt = FORMATS[name]
    answer = data.draw(st.sampled_from(sorted(fmt.answers(dataset))))
    for variant in {answer.lower(), answer.title(), answer.capitalize()} - {answer}:
        assert fmt.parse(variant, dataset) == INVALID, variant  # case matters: the lenient parser folds it
    assert fmt.parse(answer + extra, dataset) == INVALID
    assert fmt.parse(f'"{answer}"', dataset) == INVALID
    assert fmt.parse(f"Answer: {answer}", dataset) == INVALID
    assert fmt.parse(answer.replace(" ", "_") if " " in answer else answer + " " + answer, dataset) == INVALID


def test_non_text_and_empty_answers_are_invalid():
    for fmt in FORMATS.values():
        for bad in ("", "   ", "\n", None, 3, b"A"):
            assert fmt.parse(bad, "fever") == INVALID


@pytest.mark.parametrize("dataset, strings", [
    ("fever", {"SUPPORTS": SUPPORT, "REFUTES": REFUTE, "NOT ENOUGH INFO": NOT_ENOUGH_INFO}),
    ("scifact", {"SUPPORT": SUPPORT, "CONTRADICT": REFUTE, "NOT_ENOUGH_INFO": NOT_ENOUGH_INFO}),
    ("check-covid", {"SUPPORT": SUPPORT, "REFUTE": REFUTE, "NOTENOUGHINFO": NOT_ENOUGH_INFO}),
])
def test_each_dataset_reads_its_own_benchmark_strings_and_no_other(dataset, strings):
    assert LABEL_STRINGS.answers(dataset) == strings
    for text, label in strings.items():
        assert LABEL_STRINGS.parse(text, dataset) == label
    others = {"SUPPORT", "SUPPORTS", "REFUTE", "REFUTES", "CONTRADICT", "NOT ENOUGH INFO", "NOT_ENOUGH_INFO",
              "NOTENOUGHINFO", "NEI", "A"} - set(strings)
    for text in others:
        assert LABEL_STRINGS.parse(text, dataset) == INVALID, text
    assert CODES.answers(dataset) == {"A": SUPPORT, "B": REFUTE, "C": NOT_ENOUGH_INFO}
    for text in ("D", "a", "AB", "1", "(A)", "A)"):
        assert CODES.parse(text, dataset) == INVALID


def test_the_label_strings_mean_what_the_converters_read_them_as():
    """One meaning per benchmark string: where a converter reads a string, the study maps it the same way."""
    readers = {"fever": fever.LABELS, "scifact": scifact.RATIONALE_LABELS, "check-covid": check_covid.LABELS}
    for dataset, reader in readers.items():
        for label, text in study_dataset(dataset).label_strings.items():
            if text in reader:
                assert reader[text] == label, (dataset, text)
    assert set(readers) == set(DATASETS)


def test_a_permuted_code_mapping_is_a_control_and_must_be_a_permutation():
    permuted = CodesFormat(order=(NOT_ENOUGH_INFO, SUPPORT, REFUTE))
    assert permuted.parse("A", "scifact") == NOT_ENOUGH_INFO and permuted.parse("C", "scifact") == REFUTE
    assert "A if there is not enough information" in permuted.instruction("scifact")
    with pytest.raises(ValueError, match="permutation"):
        CodesFormat(order=(SUPPORT, SUPPORT, REFUTE))


def test_answers_are_capped_at_16_tokens():
    assert {f.max_new_tokens for f in FORMATS.values()} == {16}


def test_unknown_datasets_and_formats_are_one_line_of_bad_input():
    units = [Sentence(0, "x", "d")]
    calls = [lambda: CODES.parse("A", "feverous"), lambda: LABEL_STRINGS.instruction("FEVER"),
             lambda: submitted_evidence(units, "climate-fever"), lambda: study_dataset(""),
             lambda: render_study_prompt("c", units, CODES, "toy"), lambda: answer_format("json")]
    for call in calls:
        with pytest.raises(UserError) as err:
            call()
        assert "\n" not in str(err.value) and str(err.value)
    with pytest.raises(UserError, match="known: fever, scifact, check-covid"):
        study_dataset("feverous")


UNITS = [Sentence(9, "Alpha is\nbeta.", "d1"), Sentence(2, "Gamma is delta.", "d2"),
         Sentence(5, "Epsilon.", "d1"), Sentence(7, "Zeta.", "d2")]


def test_the_prompt_shows_the_units_in_the_given_order_then_the_instruction_last():
    system, user = render_study_prompt("The  claim\nhere.", UNITS, LABEL_STRINGS, "fever")
    assert system["role"] == "system" and "SUPPORTS" not in system["content"]
    lines = user["content"].split("\n")
    assert lines[:6] == ["Claim: The claim here.", "Document:", "line0: Alpha is beta.", "line1: Gamma is delta.",
                         "line2: Epsilon.", "line3: Zeta."]
    assert lines[6] == "" and lines[7] == LABEL_STRINGS.instruction("fever")
    original = render_study_prompt("c", UNITS, CODES, "fever", line_ids="original")[1]["content"]
    assert "line9: Alpha" in original and "line7: Zeta." in original


def test_conditions_of_one_unit_share_the_prompt_up_to_the_format_instruction():
    """Formats differ only after the evidence, and a smaller budget's evidence is a prefix of a larger one's."""
    codes = render_study_prompt("c", UNITS, CODES, "scifact")
    labels = render_study_prompt("c", UNITS, LABEL_STRINGS, "scifact")
    short = render_study_prompt("c", UNITS[:2], CODES, "scifact")
    assert codes[0] == labels[0] == short[0]
    instruction = CODES.instruction("scifact")
    evidence = codes[1]["content"][: -len(instruction)]
    assert labels[1]["content"] == evidence + LABEL_STRINGS.instruction("scifact")
    assert evidence.startswith(short[1]["content"][: -len(instruction)].rstrip("\n"))
    for fmt in FORMATS.values():
        for text in fmt.answers("scifact"):
            assert text in fmt.instruction("scifact")


def test_a_unit_shown_twice_is_refused():
    with pytest.raises(ValueError, match=r"\[9\] shown twice"):
        render_study_prompt("c", [*UNITS, UNITS[0]], CODES, "fever")


@pytest.mark.parametrize("dataset", ["fever", "check-covid"])
def test_a_pool_per_claim_submits_its_first_five_units_shown(dataset):
    units = [Sentence(i, f"s{i}", f"page{i % 2}") for i in (8, 3, 6, 1, 0, 4, 2)]
    assert submitted_evidence(units, dataset) == [8, 3, 6, 1, 0]
    assert submitted_evidence(units[:3], dataset) == [8, 3, 6]
    assert submitted_evidence([], dataset) == []


def test_scifact_submits_the_first_three_units_of_each_abstract_in_the_order_shown():
    docs = ["a", "b", "a", "a", "b", "a", "a", "b", "b", "b"]
    units = [Sentence(i, f"s{i}", d) for i, d in enumerate(docs)]
    assert submitted_evidence(units, "scifact") == [0, 1, 2, 3, 4, 7]
    assert submitted_evidence(list(reversed(units)), "scifact") == [9, 8, 7, 6, 5, 3]
    assert submitted_evidence(units[:2], "scifact") == [0, 1]
    assert submitted_evidence(units[:5], "fever") == [0, 1, 2, 3, 4]


def test_every_label_has_a_string_and_a_code_in_every_dataset():
    for dataset in DATASETS:
        assert sorted(LABEL_STRINGS.answers(dataset).values()) == sorted(LABELS)
        assert len(set(study_dataset(dataset).label_strings.values())) == 3
