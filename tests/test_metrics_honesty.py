"""Honest metrics (issue #11, items 5-7): one claim set, undefined scores say why, cut-off answers are counted.

- NOT_ENOUGH_INFO-gold records are not run and not scored (SPEC §1), and the count is reported;
- IS/ER/IO/g_r are null with a reason when a_0 is 0 or undefined (never IO = 100 for a
  verifier whose round-0 answers are all invalid);
- backends say why generation stopped: an answer cut off at max_new_tokens is marked
  ``truncated`` in claims.jsonl, counted per round, and the user is told to raise it.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from fae_helpers import CLAIMS, NEI, checkcovid_records, claim, mixed_claims, rnd, seal_run, write_run
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_server import LocalOpenAIServer

from data_prep.records import ClaimRecord, load_records, save_records
from fae.ablation import metrics as M
from fae.ablation.engine import call_counts_of
from fae.ablation.runio import read_claims
from fae.backends import Backend, Generation, as_generation, register
from fae.cli import main
from fae.comparison import accounting


def _run_openai(records, out, base_url, *extra):
    return main(["run", "--backend", "openai", "--model", "verifier", "--base-url", base_url,
                 "--records", str(records), "--output", str(out), "--rounds", "2", "--concurrency", "4",
                 "--no-progress", *extra])


def _with_nei(shared_data, tmp_path, n=6, n_nei=2):
    """Real Check-COVID records plus NEI-gold copies of some of them (what --include-nei data holds)."""
    recs = checkcovid_records(shared_data, n)
    nei = [ClaimRecord(id=f"{r.id}-nei", dataset=r.dataset, claim=r.claim + " (nei)", label=NEI,
                       sentences=r.sentences, evidence=[]).validate() for r in recs[:n_nei]]
    mixed = [x for pair in zip(recs[:n_nei], nei) for x in pair] + recs[n_nei:]
    save_records(mixed, tmp_path / "mixed.jsonl")
    save_records(recs, tmp_path / "sr.jsonl")
    return tmp_path / "mixed.jsonl", tmp_path / "sr.jsonl", nei


# ---------------------------------------------------------------------------
# item 5: NOT_ENOUGH_INFO-gold records
# ---------------------------------------------------------------------------


def test_fae_run_skips_nei_gold_records_counts_and_warns(shared_data, tmp_path, capsys):
    mixed, sr, nei = _with_nei(shared_data, tmp_path)
    with LocalOpenAIServer() as srv:
        assert _run_openai(mixed, tmp_path / "run", srv.base_url) == 0
        asked = {r.key for r in srv.log}
        n_requests = len(srv.log)
        srv.reset_log()
        assert _run_openai(sr, tmp_path / "ref", srv.base_url) == 0
        assert {r.key for r in srv.log} == asked  # exactly the SUPPORT/REFUTE prompts: no call on NEI claims
    err = capsys.readouterr().err
    assert f"{mixed}: 2 record(s) with gold label {NEI} are not evaluated" in err
    claims = read_claims(tmp_path / "run" / "claims.jsonl")
    assert [c["id"] for c in claims] == [r.id for r in load_records(sr)]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    ref = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    assert m["n_excluded_nei"] == 2 and ref["n_excluded_nei"] == 0 and m["n_claims"] == 6
    assert {**m, "n_excluded_nei": 0} == ref
    # each request answered one question: a round, a round's control, a gold-only, cited-only or sweep pool
    assert m["model_calls"] + sum(call_counts_of(c)["control_calls"] + call_counts_of(c)["sufficiency_calls"]
                                  for c in claims) == n_requests
    assert m["label_accuracy"] == m["round_accuracy"][0]
    assert "2 claims with gold label NOT_ENOUGH_INFO are not evaluated" in (tmp_path / "run" / "report.md").read_text()


def test_records_file_without_support_or_refute_is_exit_2_one_line(shared_data, tmp_path, capsys):
    _, _, nei = _with_nei(shared_data, tmp_path)
    save_records(nei, tmp_path / "nei.jsonl")
    with LocalOpenAIServer() as srv:
        assert _run_openai(tmp_path / "nei.jsonl", tmp_path / "run", srv.base_url) == 2
        assert not srv.log
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no SUPPORT/REFUTE record (all 2 have gold label NOT_ENOUGH_INFO)" in err[0]


def test_old_run_with_nei_gold_claims_hand_computed():
    """A claims.jsonl that holds NEI-gold claims: Acc/Strict/FEVER leave them out (counting them would give 4/6)."""
    nei_right = claim("N1", NEI, [], [rnd(r, [0, 1], NEI, reused=r > 0) for r in range(3)])
    nei_wrong = claim("N2", NEI, [], [rnd(0, [0, 1], "SUPPORT", [0]), rnd(1, [1], NEI), rnd(2, [1], NEI, reused=True)])
    m = M.compute_metrics(mixed_claims() + [nei_right, nei_wrong])
    # mixed_claims: A, B, D right at r0 (3/4); strict A, B (2/4); FEVER A (1/4); a = [3/4, 2/4, 1/4]
    assert (m["n_claims"], m["n_excluded_nei"]) == (4, 2)
    assert m["label_accuracy"] == m["round_accuracy"][0] == 0.75
    assert m["strict_accuracy"] == 0.5 and m["fever_score"] == 0.25
    assert m["model_calls"] == 10 and m["reused_calls"] == 2  # the NEI claims' calls are not this claim set's
    assert m["invalid_rate"] == [0.25, 0.25, 0.25]


def test_accounting_uses_the_claim_set_and_label_equality_of_metrics():
    # one definition: the FEVER scorer's NEI spelling is NEI in both (accounting used exact ==)
    assert accounting.label_correct("NOT ENOUGH INFO", NEI) and M.same_label("NOT ENOUGH INFO", NEI)
    # no case folding in either (look-alike folding is a guess, SPEC §3)
    assert not accounting.label_correct("support", "SUPPORT") and not M.same_label("support", "SUPPORT")
    nei_claim = claim("N", NEI, [], [rnd(0, [0], NEI), rnd(1, [0], NEI, reused=True)])
    cols = accounting.run_metric_columns([nei_claim], 1)
    assert not cols.any()  # an NEI-gold claim adds nothing to any sum


def test_compare_leaves_out_nei_gold_claims_of_old_runs(tmp_path):
    extra = ("n1", NEI, [], [(NEI, []), (NEI, []), (NEI, [])], [("SUPPORT", [0]), (NEI, []), (NEI, [])])
    a, b = write_run(tmp_path / "a", 0, CLAIMS + [extra]), write_run(tmp_path / "b", 1, CLAIMS + [extra])
    ra, rb = write_run(tmp_path / "ra", 0), write_run(tmp_path / "rb", 1)
    args = ["--bootstrap", "200", "--seed", "1"]
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "c"), *args]) == 0
    assert main(["compare", str(ra), str(rb), "--output", str(tmp_path / "rc"), *args]) == 0
    res = json.loads((tmp_path / "c" / "compare.json").read_text())
    ref = json.loads((tmp_path / "rc" / "compare.json").read_text())
    assert res["n_claims"] == 4
    for q in accounting.QUANTITIES:
        assert res[q] == ref[q], q
    assert res["metrics"]["label_accuracy"] == ref["metrics"]["label_accuracy"]
    assert any("1 NOT_ENOUGH_INFO-gold" in n for n in res["notes"])


# ---------------------------------------------------------------------------
# item 6: undefined scores say why; per-round answer rates
# ---------------------------------------------------------------------------


def all_invalid_claims(R=2):
    """Round 0 invalid everywhere; later rounds reuse it (pool unchanged): a_r = 0 for every r."""
    return [claim(f"x{k}", gold, [[0]], [rnd(r, [0, 1], None, reused=r > 0) for r in range(R + 1)])
            for k, gold in enumerate(["SUPPORT", "REFUTE", "SUPPORT"])]


def test_all_invalid_verifier_has_no_io_and_says_why():
    m = M.compute_metrics(all_invalid_claims())
    assert m["round_accuracy"] == [0.0, 0.0, 0.0]
    assert m["IS"] is None and m["ER"] is None and m["IO"] is None  # old code: IO = 1.0, the ideal
    assert m["IS_reason"] == m["ER_reason"] == m["IO_reason"] == m["retention_reason"] == "a_0 = 0"
    assert m["retention"] == [None, None, None]
    assert m["invalid_rate"] == [1.0, 1.0, 1.0] and m["nei_answer_rate"] == [0.0, 0.0, 0.0]
    assert m["truncated_rate"] == [None, None, None]  # these rounds never said


def test_defined_scores_have_no_reason_and_rates_are_hand_computed():
    cl = mixed_claims()
    cl[0]["rounds"][0]["truncated"] = False
    cl[2]["rounds"][0]["truncated"] = True  # C: invalid, cut off, reused at r1, r2
    cl[2]["rounds"][1]["truncated"] = cl[2]["rounds"][2]["truncated"] = True
    m = M.compute_metrics(cl)
    assert m["IO"] == pytest.approx(0.625) and m["IS_reason"] is None and m["retention_reason"] is None
    # NEI answers: A r2, D r2 -> [0, 0, 2/4]
    assert m["nei_answer_rate"] == [0.0, 0.0, 0.5]
    assert m["truncated_rate"] == [0.25, 0.25, 0.25]


def _write_claims(run_dir, claims):
    (run_dir / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))


def test_report_shows_na_with_reason_and_answer_rates(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    old = M.compute_metrics(all_invalid_claims())
    # a stored metrics.json with IO = 1.0 and no *_reason keys (an undefined IO): it must not show as 100
    old = {k: v for k, v in old.items() if not k.endswith("_reason")} | {"IO": 1.0}
    _write_claims(d, all_invalid_claims())
    seal_run(d, metrics=old)
    good = tmp_path / "good"
    good.mkdir()
    _write_claims(good, mixed_claims())
    seal_run(good, metrics=M.compute_metrics(mixed_claims()))
    assert main(["report", str(d), str(good), "--output", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| bad | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | n/a | n/a | n/a |" in md
    assert "bad: IS/ER/IO are n/a: a_0 = 0." in md
    assert "| bad | 100.00 / 100.00 / 100.00 | 0.00 / 0.00 / 0.00 | n/a |" in md
    assert "| good | 25.00 / 25.00 / 25.00 | 0.00 / 0.00 / 50.00 | n/a |" in md
    assert "good: IS/ER/IO are n/a" not in md and "raise --max-new-tokens" not in md


# ---------------------------------------------------------------------------
# item 7: backends say why generation stopped
# ---------------------------------------------------------------------------


def test_hf_finish_reasons_on_generated_rows():
    import torch

    new = torch.tensor([[5, 6, 7],     # no eos, filled the cap: cut off
                        [5, 2, 0],     # eos then padding: stopped
                        [2, 0, 0]])    # eos first
    from fae.backends.hf import finish_reasons

    assert finish_reasons(new, [2, 9], 3) == ["length", "stop", "stop"]
    assert finish_reasons(new, 2, 3) == ["length", "stop", "stop"]  # a single eos id
    assert finish_reasons(new[:, :2], [2], 3) == ["stop", "stop", "stop"]  # shorter than the cap: not cut off


def test_hf_generation_stops_or_is_cut_off(tiny_llama):
    from helpers import make_record_dict

    from data_prep.prompts import encode_chat, render_evidence_prompt
    from fae.backends.hf import generate_batched, greedy_config, load_hf_model

    lm, tok = load_hf_model(tiny_llama, device="cpu")
    rec = ClaimRecord.from_dict(make_record_dict())
    ids = [encode_chat(tok, m) for m in (render_evidence_prompt(rec), render_evidence_prompt(rec, [0, 1]))]
    gc = greedy_config(lm, tok, 3)
    cut = generate_batched(lm, tok, ids, gc, batch_size=2)
    assert [g.truncated for g in cut] == [True, True]  # the random model never says eos
    first = tok(cut[0].text, add_special_tokens=False)["input_ids"][0]
    gc.eos_token_id = [first]  # the token it starts with now ends the answer
    stopped = generate_batched(lm, tok, ids, gc, batch_size=2)
    assert [g.finish_reason for g in stopped] == ["stop", "stop"]


@pytest.mark.slow
def test_hf_run_with_three_new_tokens_counts_truncated_answers(shared_data, tiny_llama, tmp_path, capsys):
    recs = checkcovid_records(shared_data, 3)
    save_records(recs, tmp_path / "cc.jsonl")
    out = tmp_path / "run"
    assert main(["run", "--records", str(tmp_path / "cc.jsonl"), "--output", str(out), "--model", str(tiny_llama),
                 "--rounds", "2", "--max-new-tokens", "3", "--device", "cpu", "--no-progress"]) == 0
    err = capsys.readouterr().err
    claims = read_claims(out / "claims.jsonl")
    rounds = [rd for c in claims for rd in c["rounds"]]
    assert all(rd["truncated"] is True and not rd["valid"] for rd in rounds)
    assert all(rd["error"].startswith("answer cut off at max_new_tokens: ") for rd in rounds)
    m = json.loads((out / "metrics.json").read_text())
    assert m["truncated_rate"] == [1.0, 1.0, 1.0] and m["invalid_rate"] == [1.0, 1.0, 1.0]
    assert m["IO"] is None and m["IO_reason"] == "a_0 = 0"
    assert "raise --max-new-tokens (was 3)" in err
    report = (out / "report.md").read_text()
    assert "raise --max-new-tokens (was 3)" in report and "| 100.00 / 100.00 / 100.00 |" in report


def _four_word_verifier(body):
    return '{"label": "SUPPORT", "evidence": [0]}'  # 4 whitespace tokens


def test_openai_finish_reason_length_is_truncated(shared_data, tmp_path, capsys):
    save_records(checkcovid_records(shared_data, 4), tmp_path / "cc.jsonl")
    with LocalOpenAIServer(responder=_four_word_verifier, honor_max_tokens=True) as srv:
        assert _run_openai(tmp_path / "cc.jsonl", tmp_path / "cut", srv.base_url, "--max-new-tokens", "3") == 0
        assert _run_openai(tmp_path / "cc.jsonl", tmp_path / "ok", srv.base_url, "--max-new-tokens", "4") == 0
    err = capsys.readouterr().err
    cut = read_claims(tmp_path / "cut" / "claims.jsonl")
    assert all(c["rounds"][0]["truncated"] is True and not c["rounds"][0]["valid"] for c in cut)
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["truncated_rate"] == [1.0, 1.0, 1.0]
    assert "raise --max-new-tokens (was 3)" in err and err.count("raise --max-new-tokens") == 1
    ok = read_claims(tmp_path / "ok" / "claims.jsonl")
    assert all(rd["truncated"] is False and rd["valid"] for c in ok for rd in c["rounds"])
    assert json.loads((tmp_path / "ok" / "metrics.json").read_text())["truncated_rate"] == [0.0, 0.0, 0.0]


@register("test-plain-strings")
class PlainStringBackend(Backend):
    """A third-party backend that returns plain strings (no finish reason)."""

    def generate(self, prompts, callback=None):
        if callback:
            callback(len(prompts))
        return ['{"label": "SUPPORT", "evidence": [0]}' for _ in prompts]


def test_third_party_backend_returning_strings_still_works(shared_data, tmp_path):
    save_records(checkcovid_records(shared_data, 3), tmp_path / "cc.jsonl")
    out = tmp_path / "run"
    assert main(["run", "--backend", "test-plain-strings", "--model", "x", "--records", str(tmp_path / "cc.jsonl"),
                 "--output", str(out), "--rounds", "1", "--no-progress"]) == 0
    claims = read_claims(out / "claims.jsonl")
    assert all(rd["valid"] and "truncated" not in rd for c in claims for rd in c["rounds"])  # unknown: no key
    m = json.loads((out / "metrics.json").read_text())
    assert m["truncated_rate"] == [None, None] and m["label_accuracy"] is not None
    assert as_generation("x") == Generation("x") and as_generation(None) == Generation("")
    assert Generation("x").truncated is None and Generation("x", "length").truncated is True


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM and a CUDA GPU")
def test_vllm_reports_length_like_hf(tiny_llama):
    from helpers import make_record_dict

    from data_prep.prompts import render_evidence_prompt
    from fae.backends import get_backend
    from fae.backends.hf import HFBackend

    rec = ClaimRecord.from_dict(make_record_dict())
    prompts = [render_evidence_prompt(rec), render_evidence_prompt(rec, [0, 1])]
    opts = {"model": str(tiny_llama), "max_new_tokens": 3, "dtype": "float32"}
    v = get_backend("vllm")(opts).generate(prompts)
    h = HFBackend({**opts, "dtype": "fp32", "device": "cuda", "batch_size": 1}).generate(prompts)
    assert [g.finish_reason for g in v] == [g.finish_reason for g in h] == ["length", "length"]


# ---------------------------------------------------------------------------
# properties over random runs
# ---------------------------------------------------------------------------

_ANSWER = st.sampled_from(["SUPPORT", "REFUTE", NEI, None])


@st.composite
def random_run(draw):
    R = draw(st.integers(0, 3))
    n = draw(st.integers(0, 6))
    claims = []
    for k in range(n):
        gold = draw(st.sampled_from(["SUPPORT", "REFUTE", NEI]))
        groups = [] if gold == NEI else [[draw(st.integers(0, 3))]]
        rounds = []
        for r in range(R + 1):
            rd = rnd(r, [0, 1, 2, 3], draw(_ANSWER), draw(st.lists(st.integers(0, 5), max_size=2, unique=True)))
            if draw(st.booleans()):
                rd["truncated"] = draw(st.booleans())
            rounds.append(rd)
        claims.append(claim(f"c{k}", gold, groups, rounds))
    return claims


@settings(derandomize=True, max_examples=150, deadline=None)
@given(random_run())
def test_nei_gold_claims_never_change_a_number_and_undefined_is_explained(claims):
    m = M.compute_metrics(claims)
    sr = [c for c in claims if c["gold_label"] != NEI]
    ref = M.compute_metrics(sr) if sr else None
    assert m["n_excluded_nei"] == len(claims) - len(sr) and m["n_claims"] == len(sr)
    if ref is not None:
        assert {**m, "n_excluded_nei": 0} == ref
    assert m["label_accuracy"] == m["round_accuracy"][0]
    a0 = m["round_accuracy"][0]
    for key in ("IS", "ER", "IO"):
        assert (m[key] is None) == (m[f"{key}_reason"] is not None)
        if not a0:  # 0 or undefined: never a number, least of all the ideal IO = 1
            assert m[key] is None
    assert (m["retention_reason"] is None) == bool(a0)
    # accounting (fae compare) agrees on the same claim set
    if m["rounds"] >= 1:
        R = m["rounds"]
        got = dict(zip(accounting.run_metric_names(R), accounting.run_metrics_from_sums(accounting.run_metric_columns(claims, R).sum(0), R)))
        for key in ("label_accuracy", "strict_accuracy", "IS", "ER", "IO"):
            if m[key] is None:
                assert got[key] != got[key], key  # NaN: undefined there too
            else:
                assert got[key] == pytest.approx(100 * m[key], abs=1e-9), key


# ---------------------------------------------------------------------------
# one metric definition (issue #14): metrics.json and score accounting read answers alike
# ---------------------------------------------------------------------------


def test_an_invalid_round_is_wrong_and_names_nothing_in_metrics_and_accounting():
    # A round marked invalid but still carrying a label and ids: both modules must ignore them.
    bad = {"round": 0, "pool_ids": [0, 1], "label": "SUPPORT", "cited": [0], "hallucinated": [],
           "evidence": [0], "valid": False}
    c = claim("x", "SUPPORT", [[0]], [bad])
    assert M.round_label(bad) is None and M.named_ids(bad) == []
    m = M.compute_metrics([c])
    assert m["label_accuracy"] == m["strict_accuracy"] == m["fever_score"] == 0.0
    assert m["evidence_precision"] == 0.0 and m["invalid_rate"] == [1.0]
    cols = accounting.run_metric_columns([c], 0)
    got = accounting.run_metrics_from_sums(cols.sum(0), 0) / 100
    names = accounting.run_metric_names(0)
    for key in ("label_accuracy", "strict_accuracy", "fever_score", "evidence_precision"):
        assert got[names.index(key)] == m[key], key
    assert got[names.index("invalid_rate_0")] == 1.0
    # hand-built rounds without "valid" are valid when they carry a label
    assert M.is_valid({"label": "REFUTE"}) and not M.is_valid({"label": None})


@given(cited=st.lists(st.integers(0, 7), max_size=8, unique=True),
       groups=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True), min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_accounting_evidence_rules_are_the_metrics_rules(cited, groups):
    rec = {"id": "c", "label": "SUPPORT", "evidence": groups}
    fever = M.fever_score([{"id": "c", "label": "SUPPORT", "evidence": cited}], [rec])["strict"]
    assert accounting.evidence_eligible(cited, groups, "SUPPORT", "fever_score") == (fever == 1.0)
    r0 = {"round": 0, "label": "SUPPORT", "cited": cited, "hallucinated": [], "valid": True}
    strict = M.strict_accuracy([claim("c", "SUPPORT", groups, [r0])])
    assert accounting.evidence_eligible(cited, groups, "SUPPORT", "strict") == (strict == 1.0)
