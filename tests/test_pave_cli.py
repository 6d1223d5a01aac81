"""`fae pave` end to end: on the local OpenAI-compatible server (with and without logprobs) and a tiny hf model."""

from __future__ import annotations

import json
import math

import pytest

from data_prep.records import save_records
from fae.cli import main
from helpers import make_record_dict
from openai_server import LocalOpenAIServer, claim_of

OTHER = {"SUPPORT": "REFUTE", "REFUTE": "SUPPORT"}
N = 4


def _records(tmp_path, n=8, with_cf=lambda k: True):
    recs = []
    for k in range(n):
        gold = "SUPPORT" if k % 2 == 0 else "REFUTE"
        extra = {}
        if with_cf(k):
            extra["counterfactual_sentences"] = [{"id": 0, "text": f"FAKE statement number {k}."}]
        recs.append(make_record_dict(id=f"r{k}", claim=f"Claim number {k} holds.", label=gold, **extra))
    path = tmp_path / "eval.jsonl"
    save_records(recs, path)
    return path, {f"Claim number {k} holds.": ("SUPPORT" if k % 2 == 0 else "REFUTE", k) for k in range(n)}


def _verifier(golds, bodies):
    """claim-only: state by k % 4 (KK, KU, UK, UU); gold evidence: right; counterfactual: wrong."""

    def respond(body):
        bodies.append(body)
        gold, k = golds[claim_of(body)]
        user = body["messages"][-1]["content"]
        i = body["_choice_index"]
        if "Document:" not in user:
            pattern = {0: [gold] * N, 1: [OTHER[gold]] * N,
                       2: [gold, gold, gold, OTHER[gold]], 3: [OTHER[gold]] * 3 + [gold]}[k % 4]
            label = pattern[i]
        elif "FAKE" in user:
            label = OTHER[gold]
        else:
            label = gold
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    return respond


def _logprobs(body, content):
    """Token logprobs: the label token with runs whose confidence varies on claim-only prompts."""
    label = json.loads(content)["label"]
    other = "REFUTE" if label == "SUPPORT" else "SUPPORT"
    claim_only = "Document:" not in body["messages"][-1]["content"]
    p = (0.55 + 0.1 * body["_choice_index"]) if claim_only else 0.97
    head, tail = '{"label": "', content[len('{"label": "') + len(label):]
    tok = lambda t, lp, top=(): {"token": t, "logprob": lp, "bytes": None,  # noqa: E731
                                 "top_logprobs": [{"token": x, "logprob": y, "bytes": None} for x, y in top]}
    return {"content": [tok(head, 0.0), tok(label, math.log(p), [(label, math.log(p)), (other, math.log(1 - p))]),
                        tok(tail, 0.0)], "refusal": None}


def _pave(records, out, url, *extra):
    return main(["pave", "--records", str(records), "--backend", "openai", "--model", "m", "--base-url", url,
                 "--samples", str(N), "--temperature", "0.8", "--output", str(out), "--no-progress",
                 "--tune-split", "0.5", "--max-retries", "0", *extra])


def test_pave_on_openai_server_with_logprobs(tmp_path, capsys):
    records, golds = _records(tmp_path)
    bodies = []
    with LocalOpenAIServer(responder=_verifier(golds, bodies), logprobs_fn=_logprobs) as srv:
        out = tmp_path / "pave"
        assert _pave(records, out, srv.base_url) == 0
        n_requests = srv.count()
        # resume: a rerun samples nothing new
        assert _pave(records, out, srv.base_url) == 0
        assert srv.count() == n_requests
    assert n_requests == 8 * 3  # one request per (claim, condition), N choices each
    assert all(b["n"] == N and b["temperature"] == 0.8 and b["logprobs"] for b in bodies)
    res = json.loads((out / "pave.json").read_text())
    st = res["profile"]["states"]
    assert [st[s]["n"] for s in ("KK", "KU", "UK", "UU")] == [2, 2, 2, 2]
    # gold evidence always corrects, counterfactual evidence always misleads
    assert res["profile"]["CR"] == 1.0 and res["profile"]["PR"] == 0.0 and res["profile"]["Margin"] == 0.0
    assert st["KK"]["OI"] is None  # PR = 0 -> odds of influence infinite -> null in JSON
    arb = res["arbitration"]
    assert arb["stability"] == ["jsd"] and arb["n_tune"] + arb["n_test"] == 8
    assert arb["baselines"]["evidence_only"]["CE"] == 1.0 and arb["baselines"]["evidence_only"]["IE"] == 0.0
    assert 0 <= arb["OA"] <= 1 and arb["OA"] == pytest.approx((arb["CE"] + arb["IE"]) / 2)
    line = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    probs = line["conditions"]["claim_only"]["probs"]
    assert len(probs) == N and all(sum(p) == pytest.approx(1.0) for p in probs)
    assert probs[0][0] == pytest.approx(0.55)  # r0 gold SUPPORT, first run p = .55
    md = (out / "pave.md").read_text()
    assert "| Known-Knows (persistence) |" in md and "| JSD arbitration |" in md
    assert "Margin 0.000" in capsys.readouterr().out


def test_pave_vote_variant_without_logprobs_and_without_counterfactuals(tmp_path):
    records, golds = _records(tmp_path, with_cf=lambda k: False)
    with LocalOpenAIServer(responder=_verifier(golds, [])) as srv:
        out = tmp_path / "pave"
        assert _pave(records, out, srv.base_url) == 0
        assert _pave(records, tmp_path / "p2", srv.base_url, "--stability", "jsd") == 2  # no probabilities
    res = json.loads((out / "pave.json").read_text())
    assert res["arbitration"]["stability"] == ["vote"]
    assert res["profile"]["PR"] is None and res["arbitration"]["IE"] is None
    assert any("CE only" in n for n in res["notes"])


def test_pave_rejects_greedy_decoding(tmp_path, capsys):
    records, _ = _records(tmp_path, n=2)
    assert main(["pave", "--records", str(records), "--model", "m", "--output", str(tmp_path / "o"),
                 "--temperature", "0"]) == 2
    assert "temperature must be > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_pave_on_tiny_hf_model(tmp_path, tiny_llama):
    records, _ = _records(tmp_path, n=4)
    out = tmp_path / "pave"
    assert main(["pave", "--records", str(records), "--backend", "hf", "--model", str(tiny_llama),
                 "--samples", "3", "--temperature", "1.0", "--max-new-tokens", "12", "--output", str(out),
                 "--no-progress", "--tune-split", "0.5"]) == 0
    res = json.loads((out / "pave.json").read_text())
    assert res["n_claims"] == 4 and res["arbitration"]["stability"] == ["jsd"]
    assert sum(res["profile"]["states"][s]["ratio"] for s in ("KK", "KU", "UK", "UU")) == pytest.approx(1.0)
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    for line in lines:
        for cond in ("claim_only", "gold_evidence", "counterfactual"):
            c = line["conditions"][cond]
            assert len(c["answers"]) == 3 and len(c["raw"]) == 3
            assert all(len(p) == 3 and sum(p) == pytest.approx(1.0, abs=1e-5) for p in c["probs"])
    assert (out / "pave.md").is_file()
