"""Verifiers that take a shortcut or read their evidence, behind a real OpenAI-compatible server, for the
control arm's tests (tests/test_fae_control.py) and the real-model summary's (tests/test_summarize.py)."""

import json

import pytest
from openai_server import LocalOpenAIServer, pool_lines

from data_prep.records import ClaimRecord, save_records
from fae.ablation.runio import read_claims
from fae.cli import main
from helpers import make_record_dict

KEY = "sk-control-test"
ENV = "FAE_CONTROL_TEST_KEY"
N_LINES = 6
PROOF = "the measured value proves it"


def records(n_claims: int = 40) -> list[ClaimRecord]:
    """SUPPORT claims of six lines; the proving line sits at a different place in each pool."""
    out = []
    for k in range(n_claims):
        gold = k % N_LINES
        sents = [{"id": i, "text": PROOF if i == gold else f"unrelated statement {k} {i}"} for i in range(N_LINES)]
        out.append(ClaimRecord.from_dict(make_record_dict(id=f"c{k:02d}", claim=f"claim number {k}",
                                                          label="SUPPORT", sentences=sents, evidence=[[gold]])))
    return out


def answer(label: str, ids=()) -> str:
    return json.dumps({"label": label, "evidence": list(ids)})


def abstains_when_shrunk(body: dict) -> str:
    lines = pool_lines(body)
    return answer("SUPPORT", [min(lines)]) if len(lines) == N_LINES else answer("NOT_ENOUGH_INFO")


def has_hole(numbers) -> bool:
    return sorted(numbers) != list(range(len(numbers)))


def abstains_on_hole(body: dict) -> str:
    lines = pool_lines(body)
    return answer("NOT_ENOUGH_INFO") if has_hole(lines) else answer("SUPPORT", [min(lines)])


def reads_evidence(body: dict) -> str:
    proof = [i for i, text in pool_lines(body).items() if text == PROOF]
    return answer("SUPPORT", proof) if proof else answer("NOT_ENOUGH_INFO")


def fae_run(records_path, out, base_url, *extra) -> int:
    return main(["run", "--backend", "openai", "--model", "verifier", "--base-url", base_url, "--api-key-env", ENV,
                 "--records", str(records_path), "--output", str(out), "--rounds", "2", "--concurrency", "4",
                 "--no-progress", *extra])


def run_with(verifier, records_path, out, *extra) -> tuple[dict, list[dict]]:
    with LocalOpenAIServer(responder=verifier, api_key=KEY) as srv:
        assert fae_run(records_path, out, srv.base_url, *extra) == 0
    return json.loads((out / "metrics.json").read_text()), read_claims(out / "claims.jsonl")


@pytest.fixture()
def records_file(tmp_path):
    """:func:`records` in a claims file."""
    path = tmp_path / "claims.jsonl"
    save_records(records(), path)
    return path


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    """The test server's key in the environment variable `fae run --api-key-env` names (autouse where imported)."""
    monkeypatch.setenv(ENV, KEY)
