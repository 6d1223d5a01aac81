import json

import pytest
from helpers import make_record_dict
from transformers import AutoTokenizer

from data_prep.prompts import (
    EVIDENCE_SYSTEM_PROMPT,
    KNOWLEDGE_SYSTEM_PROMPT,
    encode_chat,
    format_answer,
    parse_answer,
    render_chat,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import ClaimRecord

REC = ClaimRecord.from_dict(make_record_dict())


def test_evidence_prompt_layout_keeps_ids_after_ablation():
    msgs = render_evidence_prompt(REC, pool_ids=[3, 1])
    assert msgs[0] == {"role": "system", "content": EVIDENCE_SYSTEM_PROMPT}
    assert msgs[1]["role"] == "user"
    assert msgs[1]["content"] == (
        "Claim: The sky is blue.\nDocument:\nline1: Grass is green.\nline3: Rayleigh scattering colours the sky."
    )
    full = render_evidence_prompt(REC)[1]["content"]
    assert full.splitlines()[2:] == [
        "line0: The sky appears blue by day.",
        "line1: Grass is green.",
        "line3: Rayleigh scattering colours the sky.",
    ]
    assert EVIDENCE_SYSTEM_PROMPT.startswith("Verify the claim strictly against the provided evidence.")


def test_unknown_pool_id_is_an_error():
    with pytest.raises(ValueError, match="pool ids \\[9\\]"):
        render_evidence_prompt(REC, [0, 9])


def test_newlines_inside_sentences_cannot_fake_lines():
    rec = ClaimRecord.from_dict(make_record_dict(sentences=[{"id": 0, "text": "a\nline7: fake"}], evidence=[[0]]))
    assert render_evidence_prompt(rec)[1]["content"].endswith("line0: a line7: fake")


def test_knowledge_prompt_is_claim_only():
    msgs = render_knowledge_prompt(REC)
    assert msgs == [
        {"role": "system", "content": KNOWLEDGE_SYSTEM_PROMPT},
        {"role": "user", "content": "Claim: The sky is blue."},
    ]
    assert KNOWLEDGE_SYSTEM_PROMPT.startswith("Verify the claim using general knowledge.")


@pytest.mark.parametrize("arch, header", [("llama", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
                                          ("qwen2", "<|im_start|>assistant\n")])
def test_rendering_through_real_chat_template(request, arch, header):
    path = request.getfixturevalue("tiny_llama" if arch == "llama" else "tiny_qwen")
    tok = AutoTokenizer.from_pretrained(path)
    text = render_chat(tok, render_evidence_prompt(REC, [0, 3]))
    assert text.endswith(header)
    assert "line0: The sky appears blue by day.\nline3: Rayleigh" in text
    assert "line1:" not in text
    ids = encode_chat(tok, render_evidence_prompt(REC))
    assert tok.decode(ids) == render_chat(tok, render_evidence_prompt(REC))
    if arch == "llama":
        assert ids.count(tok.bos_token_id) == 1  # no doubled <|begin_of_text|>


def test_format_answer_parses_back():
    text = format_answer("REFUTE", [3, 0, 3])
    assert json.loads(text) == {"label": "REFUTE", "evidence": [0, 3]}
    p = parse_answer(text, [0, 1, 3])
    assert p.valid and p.label == "REFUTE" and p.cited == [0, 3] and p.hallucinated == []
    with pytest.raises(ValueError):
        format_answer("TRUE", [])


@pytest.mark.parametrize(
    "text, label, cited, halluc",
    [
        ('{"label": "SUPPORT", "evidence": [0, 3]}', "SUPPORT", [0, 3], []),
        ('```json\n{"label": "SUPPORT", "evidence": [3]}\n```', "SUPPORT", [3], []),
        ('Sure! Here is my answer: {"label": "NOT_ENOUGH_INFO", "evidence": []} Done.', "NOT_ENOUGH_INFO", [], []),
        ('{"label": "refute", "evidence": ["line1", "3", 1]}', "REFUTE", [1, 3], []),
        ('{"label": "SUPPORT", "evidence": [0, 7, 12]}', "SUPPORT", [0], [7, 12]),
        ('{"label": "SUPPORT", "evidence": [0]} {"label": "SUPPORT", "evidence": [0]}', "SUPPORT", [0], []),
    ],
)
def test_parser_accepts_honest_answers(text, label, cited, halluc):
    p = parse_answer(text, [0, 1, 3])
    assert p.valid, p.error
    assert (p.label, p.cited, p.hallucinated) == (label, cited, halluc)


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("SUPPORT", "no JSON object"),
        ('{"label": "SUPPORT", "evidence": [0]', "no JSON object"),  # truncated
        ('{"label": "SUPPORTS", "evidence": [0]}', "not one of"),
        ('{"label": "SUPPORT"}', "missing 'evidence'"),
        ('{"label": "SUPPORT", "evidence": "0, 3"}', "not a list"),
        ('{"label": "SUPPORT", "evidence": [0.5]}', "not a sentence id"),
        ('{"label": "SUPPORT", "evidence": [true]}', "not a sentence id"),
        ('{"label": "SUPPORT", "evidence": [0]} or {"label": "REFUTE", "evidence": [1]}', "several different"),
        ('{"label": ["SUPPORT"], "evidence": []}', "not a string"),
    ],
)
def test_parser_rejects_ambiguous_or_malformed_answers(text, why):
    p = parse_answer(text, [0, 1, 3])
    assert not p.valid and p.label is None
    assert why in p.error


# -- never guess, never raise (issue #11 item 11, issue #12) -------------------------

DEEP = '{"label": "SUPPORT", "evidence": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"label": "REFUTE", "label": "SUPPORT", "evidence": [0]}', "key 'label' given twice"),
        ('{"label": "SUPPORT", "evidence": [0], "evidence": [1]}', "key 'evidence' given twice"),
        ('{"label": "\u017fupport", "evidence": [0]}', "not one of"),  # long s: "ſupport".upper() == "SUPPORT"
        ('{"label": "SUPPORT\u200b", "evidence": [0]}', "not one of"),  # zero-width space
        ('{"label": "SUPPORT", "evidence": ["\u0663"]}', "not a sentence id"),  # Arabic-Indic three
        ('{"label": "SUPPORT", "evidence": ["line \uff13"]}', "not a sentence id"),  # full-width three
        ('{"label": "SUPPORT", "evidence": ["line\u00a03"]}', "not a sentence id"),  # no-break space
        (DEEP, "nested too deeply"),
        ('{"label": "SUPPORT", "evidence": [' + "1" * 5000 + "]}", "too long"),
        ('{"label": "SUPPORT", "evidence": ["line' + "1" * 5000 + '"]}', "not a sentence id"),
        ('{"label": "SUPPORT", "evidence": [' + str(2**64) + "]}", "not a sentence id"),
    ],
)
def test_parser_never_guesses_nor_raises(text, why):
    from data_prep.enhance.prompt import parse_annotation

    p = parse_answer(text, [0, 1, 3])
    assert not p.valid and p.label is None
    assert why in p.error and len(p.error) < 300
    if "label" not in why and "not one of" not in why:  # the annotator parser shares the rules
        a = parse_annotation(text.replace('"label": "SUPPORT", ', ""), [0, 1, 3])
        assert not a.valid and why in a.error


def test_annotator_parser_rejects_a_repeated_evidence_key():
    from data_prep.enhance.prompt import parse_annotation

    a = parse_annotation('{"evidence": [0], "evidence": [1]}', [0, 1])
    assert not a.valid and "key 'evidence' given twice" in a.error


def test_prompt_format_version_is_declared():
    from data_prep import prompts

    assert prompts.PROMPT_FORMAT_VERSION == 1
