"""Schema-constrained decoding (issue 18): schemas, the hf (xgrammar) and openai backends, the run fingerprint."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.prompts import parse_answer, render_evidence_prompt, render_knowledge_prompt
from data_prep.records import LABELS, load_records
from data_prep.schemas import annotator_schema, answer_schema, schema_for_prompt, shown_pool_ids
from fae.cli import main
from fae.runio import read_claims
from fae_helpers import write_checkcovid
from openai_server import LocalOpenAIServer, overlap_verifier


@pytest.fixture(scope="module")
def cc_records(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "cc.jsonl", n=6)


# -- schemas ----------------------------------------------------------------


def test_answer_schema_puts_label_first_and_limits_ids_to_the_pool():
    schema = answer_schema([7, 0, 3])
    assert list(schema["properties"]) == ["label", "evidence"]  # soft-FAE reads the label position
    assert schema["properties"]["label"]["enum"] == list(LABELS)
    assert schema["properties"]["evidence"]["items"]["enum"] == [0, 3, 7]
    assert schema["additionalProperties"] is False
    assert annotator_schema([2, 5])["properties"]["evidence"]["items"]["enum"] == [2, 5]
    assert answer_schema([])["properties"]["evidence"] == {"type": "array", "maxItems": 0}


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=12, unique=True),
       st.data())
def test_shown_pool_ids_reads_back_exactly_the_pool_shown(ids, data):
    """Whatever the sentence and claim texts (newlines, 'lineN:' look-alikes), the schema is the pool shown."""
    from data_prep.records import ClaimRecord, Sentence

    text = st.text(alphabet=st.sampled_from(list("ab :\n\tline0123Document")), max_size=30)
    sents = [Sentence(id=i, text=data.draw(text) or "x") for i in ids]
    rec = ClaimRecord(id="r", dataset="t", claim=data.draw(text) or "c", label="SUPPORT",
                      sentences=sents, evidence=[[ids[0]]])
    shown = data.draw(st.lists(st.sampled_from(ids), unique=True))
    assert shown_pool_ids(render_evidence_prompt(rec, shown)) == [i for i in ids if i in shown]
    assert shown_pool_ids(render_knowledge_prompt(rec)) is None


# -- hf backend through xgrammar ------------------------------------------------


def hf_run(records, out, model, *extra):
    return main(["run", "--records", str(records), "--output", str(out), "--model", str(model),
                 "--rounds", "3", "--batch-size", "4", "--max-new-tokens", "64", "--no-progress", *extra])


@pytest.mark.slow
def test_random_tiny_model_under_the_constraint_answers_validly_in_every_round(cc_records, tiny_llama, tmp_path):
    """The random model answers blank lines unconstrained (0% valid); constrained, every round of
    a real `fae run` parses and cites only ids of the pool it was shown."""
    assert hf_run(cc_records, tmp_path / "free", tiny_llama) == 0
    free = [r for c in read_claims(tmp_path / "free" / "claims.jsonl") for r in c["rounds"]]
    assert not any(r["valid"] for r in free)

    assert hf_run(cc_records, tmp_path / "cd", tiny_llama, "--constrained-decoding") == 0
    claims = read_claims(tmp_path / "cd" / "claims.jsonl")
    rounds = [r for c in claims for r in c["rounds"]]
    assert len(claims) == len(load_records(cc_records)) and len(rounds) == 4 * len(claims)
    assert all(r["valid"] for r in rounds)
    assert all(r["hallucinated"] == [] and set(r["cited"]) <= set(r["pool_ids"]) for r in rounds)
    config = json.loads((tmp_path / "cd" / "config.json").read_text())
    assert config["constrained_decoding"] is True
    assert "constrained decoding: on" in (tmp_path / "cd" / "report.md").read_text()
    log = [json.loads(x) for x in (tmp_path / "cd" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["backend_stats"]["constrained_prompts"] > 0
