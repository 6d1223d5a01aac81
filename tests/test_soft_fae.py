"""Soft FAE (issue 16): label probabilities per round, soft metrics, report, compare."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fae.backends.label_probs import (
    LABELS,
    label_probs_from_top_logprobs,
    normalise,
    openai_token_list,
    teacher_forced_label_probs,
)

# ---------------------------------------------------------------------------
# hf: teacher forcing against a plain forward pass
# ---------------------------------------------------------------------------


def _by_hand(lm, prompt_ids, answer_ids):
    """Σ log p(answer token | everything before it), one unpadded sequence, no cache."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(answer_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), -1)
    n = len(prompt_ids)
    return [logp[n + t - 1, tok].item() for t, tok in enumerate(answer_ids)]


def _scored_slice(answers):
    """Where the three answers' tokens differ, plus the first shared token after (the closing quote)."""
    n = 0
    while len({a[n] for a in answers}) == 1:
        n += 1
    m = 0
    while all(len(a) - m > n for a in answers) and len({a[-1 - m] for a in answers}) == 1:
        m += 1
    return n, m - 1


def test_hf_label_probs_match_a_plain_forward_pass(tiny_model):
    from data_prep.prompts import encode_chat
    from fae.backends.hf import load_hf_model

    lm, tok = load_hf_model(tiny_model, device="cpu", dtype="fp32")  # compared with fp32 by hand
    prompts = [[{"role": "user", "content": "Claim: " + "x " * n}] for n in (1, 7, 3)]
    ids = [encode_chat(tok, m) for m in prompts]
    got = teacher_forced_label_probs(lm, tok, ids, tok.pad_token_id)  # one padded batch
    answers = [tok.encode(json.dumps({"label": lab, "evidence": []}), add_special_tokens=False) for lab in LABELS]
    n, keep_tail = _scored_slice(answers)
    assert keep_tail >= 0
    for p, (probs, logprobs) in zip(ids, got):
        full = {lab: _by_hand(lm, p, a) for lab, a in zip(LABELS, answers)}
        scored = {lab: full[lab][n:len(full[lab]) - keep_tail] for lab in LABELS}
        for lab in LABELS:
            assert len(scored[lab]) >= 2  # the label's tokens and the closing quote
            assert logprobs[lab] == pytest.approx(sum(scored[lab]), abs=1e-5)
        z = sum(math.exp(sum(v)) for v in scored.values())
        for lab in LABELS:
            assert probs[lab] == pytest.approx(math.exp(sum(scored[lab])) / z, abs=1e-5)
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)


def test_word_level_tokenizer_scores_its_label_words():
    """The demo base model's word tokenizer has '"SUPPORT",' as one token: still three distinct labels."""
    from transformers import AutoTokenizer

    from fae.backends.label_probs import label_continuations
    from real.demo.pipeline import BASE_DIR

    tok = AutoTokenizer.from_pretrained(BASE_DIR)
    shared, conts = label_continuations(tok)
    assert len({tuple(c) for c in conts}) == 3 and all(len(c) == 2 for c in conts)
    assert tok.convert_ids_to_tokens(conts[0])[0] == '"SUPPORT",'


def test_hf_backend_label_probs_leave_answers_unchanged(tiny_llama):
    from fae.backends.hf import HFBackend

    prompts = [[{"role": "user", "content": f"Claim {k}: " + "y " * k}] for k in range(5)]
    on = HFBackend({"model": str(tiny_llama), "device": "cpu", "dtype": "fp32", "batch_size": 2,
                    "max_new_tokens": 6})
    off = HFBackend({"model": str(tiny_llama), "device": "cpu", "dtype": "fp32", "batch_size": 2,
                     "max_new_tokens": 6, "label_probs": False})
    a, b = on.generate(prompts), off.generate(prompts)
    assert [g.text for g in a] == [g.text for g in b]
    assert all(g.label_probs is None for g in b)
    # the backend reuses generate's KV cache (cut back to the prompt): same values as a plain forward pass
    from data_prep.prompts import encode_chat

    answers = [on.tok.encode(json.dumps({"label": lab, "evidence": []}), add_special_tokens=False)
               for lab in LABELS]
    n, keep_tail = _scored_slice(answers)
    for m, g in zip(prompts, a):
        p = encode_chat(on.tok, m)
        for lab, ans in zip(LABELS, answers):
            by_hand = _by_hand(on.lm, p, ans)
            assert g.label_logprobs[lab] == pytest.approx(sum(by_hand[n:len(by_hand) - keep_tail]), abs=1e-5)
        assert sum(g.label_probs.values()) == pytest.approx(1.0)


# ---------------------------------------------------------------------------
# openai / vllm: reading the label position from top logprobs
# ---------------------------------------------------------------------------

ALTS = [("SUP", math.log(0.7)), ("RE", math.log(0.2)), ("NOT", math.log(0.05)), ("S", math.log(0.03)),
        ("{", math.log(0.01))]


def test_top_logprobs_at_the_label_position_hand_values():
    tokens = [('{"', []), ('label', []), ('":', []), (' "', []), ("SUP", ALTS), ('PORT", "evidence": []}', [])]
    probs, logprobs, why = label_probs_from_top_logprobs(tokens)
    assert why is None
    assert logprobs["SUPPORT"] == pytest.approx(math.log(0.73))  # "SUP" + "S" both start SUPPORT
    assert logprobs["REFUTE"] == pytest.approx(math.log(0.2))
    assert probs == pytest.approx({"SUPPORT": 0.73 / 0.98, "REFUTE": 0.2 / 0.98, "NOT_ENOUGH_INFO": 0.05 / 0.98})


def test_label_token_that_also_carries_the_quote():
    # the tokenizer merged the opening quote into the label token: alternatives share that head
    tokens = [('{"label":', []), (' "RE', [(' "RE', math.log(0.6)), (' "SUP', math.log(0.3)), (' "N', -5.0),
                                            ("RE", math.log(0.05))]), ('FUTE"}', [])]
    probs, logprobs, _ = label_probs_from_top_logprobs(tokens)
    assert logprobs["REFUTE"] == pytest.approx(math.log(0.6))  # "RE" lacks the head ' "': not counted
    assert probs["NOT_ENOUGH_INFO"] == pytest.approx(math.exp(-5.0) / (0.9 + math.exp(-5.0)))


def test_no_label_or_no_alternatives_gives_a_reason():
    assert label_probs_from_top_logprobs([("hello", [])])[2] == "no label in the answer"
    assert label_probs_from_top_logprobs([('{"label": "', []), ("x", [("x", 0.0)])])[2].startswith("no label among")
    assert label_probs_from_top_logprobs([('{"label": "', [])])[2] == "the answer ends before the label value"
    assert normalise({"SUPPORT": None, "REFUTE": None, "NOT_ENOUGH_INFO": None}) is None


def test_openai_token_list_adds_the_chosen_token():
    lp = {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "b", "logprob": -2.0}]}]}
    assert openai_token_list(lp) == [("a", [("b", -2.0), ("a", -0.1)])]
    assert openai_token_list(None) is None and openai_token_list({"content": None}) is None


def _known_logprobs(body, content):
    """The label token with known alternatives; P(gold-first-token) depends on the pool size."""
    label = json.loads(content)["label"]
    n_lines = body["messages"][-1]["content"].count("\nline")
    p_sup = 0.1 + 0.1 * min(n_lines, 8)  # 0.1 .. 0.9
    head, first = '{"label": "', {"SUPPORT": "SUP", "REFUTE": "REF", "NOT_ENOUGH_INFO": "NOT"}[label]
    tok = lambda t, lp, top=(): {"token": t, "logprob": lp, "bytes": None,  # noqa: E731
                                 "top_logprobs": [{"token": x, "logprob": y, "bytes": None} for x, y in top]}
    top = [("SUP", math.log(p_sup * 0.9)), ("REF", math.log((1 - p_sup) * 0.6)), ("NOT", math.log((1 - p_sup) * 0.3))]
    return {"content": [tok(head, 0.0), tok(first, dict(top)[first], top), tok(content[len(head) + len(first):], 0.0)],
            "refusal": None}


def _expected_probs(pool_size):
    p = 0.1 + 0.1 * min(pool_size, 8)
    w = {"SUPPORT": p * 0.9, "REFUTE": (1 - p) * 0.6, "NOT_ENOUGH_INFO": (1 - p) * 0.3}
    z = sum(w.values())
    return {k: v / z for k, v in w.items()}


def _openai_run(records, out, url, *extra):
    from fae.cli import main

    return main(["run", "--backend", "openai", "--model", "v", "--base-url", url, "--records", str(records),
                 "--output", str(out), "--rounds", "2", "--no-progress", "--max-retries", "0", *extra])


@pytest.fixture(scope="module")
def cc_records(shared_data, tmp_path_factory):
    from fae_helpers import write_checkcovid

    return write_checkcovid(shared_data, tmp_path_factory.mktemp("soft") / "cc.jsonl", n=6)


def test_openai_label_probs_from_a_server_with_known_logprobs(cc_records, tmp_path):
    from openai_server import LocalOpenAIServer

    from fae.ablation.runio import read_claims

    with LocalOpenAIServer(logprobs_fn=_known_logprobs) as srv:
        assert _openai_run(cc_records, tmp_path / "run", srv.base_url) == 0
    claims = read_claims(tmp_path / "run" / "claims.jsonl")
    n = 0
    for c in claims:
        for rd in c["rounds"]:
            assert rd["label_probs"] == pytest.approx(_expected_probs(len(rd["pool_ids"])), abs=1e-9)
            n += 1
    assert n == len(claims) * 3
    soft = json.loads((tmp_path / "run" / "metrics.json").read_text())["soft"]
    assert soft["soft_IS"] is not None and soft["ece"] is not None and soft["n_with_probs"] == len(claims)
    # fae report: the soft table beside IS and the two figures
    from fae.cli import main

    assert main(["report", str(tmp_path / "run"), "--output", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| Model | IS | soft IS | NEI area | ECE r0 | P(gold) | P(NEI) | claims with probs |" in md
    assert f"| {100 * soft['soft_IS']:.2f} | {100 * soft['nei_area']:.2f} | {100 * soft['ece']:.2f} |" in md
    for png in ("soft_trajectory.png", "reliability.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:4] == b"\x89PNG" and png in md


def test_openai_server_without_logprobs_records_why(cc_records, tmp_path):
    from openai_server import LocalOpenAIServer

    from fae.ablation.runio import read_claims

    with LocalOpenAIServer() as srv:
        assert _openai_run(cc_records, tmp_path / "run", srv.base_url) == 0
    claims = read_claims(tmp_path / "run" / "claims.jsonl")
    assert not any("label_probs" in rd for c in claims for rd in c["rounds"])  # old shape kept
    log = [json.loads(x) for x in (tmp_path / "run" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["backend_stats"]["label_probs_skipped"] == "the server returned no logprobs"
    soft = json.loads((tmp_path / "run" / "metrics.json").read_text())["soft"]
    assert soft["soft_IS"] is None and "no label probabilities" in soft["soft_IS_reason"]
    assert soft["ece"] is None and soft["ece_reason"]
    from fae.cli import main

    assert main(["report", str(tmp_path / "run"), "--output", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "soft metrics n/a: no label probabilities" in md and not (tmp_path / "rep" / "reliability.png").exists()
    # a stale figure of an earlier report into the same directory is removed
    (tmp_path / "rep" / "soft_trajectory.png").write_bytes(b"old")
    assert main(["report", str(tmp_path / "run"), "--output", str(tmp_path / "rep")]) == 0
    assert not (tmp_path / "rep" / "soft_trajectory.png").exists()


def test_bootstrap_band_hand_values():
    from fae.ablation.report import bootstrap_band

    mean, lo, hi = bootstrap_band([[1.0, 0.0, None], [1.0, 1.0, None]], n_resamples=200)
    assert mean == [1.0, 0.5, None] and lo[0] == hi[0] == 1.0 and lo[2] is None
    assert lo[1] == 0.0 and hi[1] == 1.0  # two claims: resamples give 0, .5 or 1


# ---------------------------------------------------------------------------
# soft metrics: hand-computed values
# ---------------------------------------------------------------------------


def _claim(gold, probs_per_round):
    rounds = []
    for r, p in enumerate(probs_per_round):
        rd = {"round": r, "pool_ids": [0], "label": "SUPPORT", "cited": [], "hallucinated": [],
              "valid": True, "reused": False, "evidence": [], "raw_output": ""}
        if p is not None:
            rd["label_probs"] = dict(zip(LABELS, p))
        rounds.append(rd)
    return {"id": gold + str(len(rounds)), "gold_label": gold, "gold_groups": [[0]], "rounds": rounds}


def test_soft_metrics_hand_values():
    from fae.ablation.soft_metrics import soft_metrics

    claims = [
        _claim("SUPPORT", [(0.8, 0.1, 0.1), (0.4, 0.1, 0.5), (0.2, 0.0, 0.8)]),
        _claim("REFUTE", [(0.3, 0.6, 0.1), (0.3, 0.3, 0.4), (0.1, 0.1, 0.8)]),
        _claim("NOT_ENOUGH_INFO", [(0.0, 0.0, 1.0)] * 3),  # excluded like the hard metrics
    ]
    m = soft_metrics(claims)
    assert m["n_with_probs"] == 2
    assert m["p_gold"] == pytest.approx([0.7, 0.35, 0.15])  # (.8+.6)/2, (.4+.3)/2, (.2+.1)/2
    assert m["p_nei"] == pytest.approx([0.1, 0.45, 0.8])
    assert m["soft_IS"] == pytest.approx(1 - 0.35 / 0.7)  # = 0.5
    assert m["nei_area"] == pytest.approx((0.45 + 0.8) / 2)
    # round 0: conf .8 (bin 8, correct) and .6 (bin 6, correct): ECE = (.2 + .4) / 2
    assert m["ece"] == pytest.approx(0.3)
    bins = m["reliability"]
    assert bins[8]["n"] == 1 and bins[8]["accuracy"] == 1.0 and bins[6]["confidence"] == pytest.approx(0.6)
    assert sum(b["n"] for b in bins) == 2
    assert len(m["reliability"]) == 10 and m["soft_IS_reason"] is None


def test_calibration_wrong_argmax_and_top_bin():
    from fae.ablation.soft_metrics import calibration

    ece, bins = calibration([({"SUPPORT": 1.0, "REFUTE": 0.0, "NOT_ENOUGH_INFO": 0.0}, "SUPPORT"),
                             ({"SUPPORT": 0.25, "REFUTE": 0.35, "NOT_ENOUGH_INFO": 0.4}, "SUPPORT")])
    # p = 1.0 falls in the last bin [.9, 1] (correct, gap 0); .4 -> NEI, wrong (gap .4)
    assert ece == pytest.approx(0.2)
    assert bins[9]["n"] == 1 and bins[4]["accuracy"] == 0.0
    assert calibration([]) == (None, [])


def test_soft_metrics_null_with_reasons():
    from fae.ablation.soft_metrics import soft_metrics

    old = soft_metrics([_claim("SUPPORT", [None, None])])  # a run made before soft FAE
    assert old["soft_IS"] is None and old["nei_area"] is None and old["ece"] is None
    assert all(old[k] for k in ("soft_IS_reason", "nei_area_reason", "ece_reason"))
    assert old["p_gold"] == [None, None]
    zero = soft_metrics([_claim("SUPPORT", [(0.0, 0.5, 0.5), (0.0, 0.0, 1.0)])])
    assert zero["soft_IS"] is None and "E[P_0(gold)] is 0" in zero["soft_IS_reason"]
    assert zero["nei_area"] == 1.0
    part = soft_metrics([_claim("SUPPORT", [(0.5, 0.5, 0.0), None])])
    assert part["soft_IS"] is None and part["nei_area"] is None and part["ece"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------
# fae compare: paired bootstrap of the soft metrics
# ---------------------------------------------------------------------------

# per claim: gold, then (P_r(SUPPORT), P_r(REFUTE), P_r(NEI)) for r = 0, 1 in system A, then B
SOFT_CLAIMS = [
    ("c1", "SUPPORT", [(0.8, 0.1, 0.1), (0.6, 0.1, 0.3)], [(0.9, 0.05, 0.05), (0.1, 0.0, 0.9)]),
    ("c2", "REFUTE", [(0.2, 0.7, 0.1), (0.2, 0.6, 0.2)], [(0.1, 0.8, 0.1), (0.0, 0.2, 0.8)]),
    ("c3", "SUPPORT", [(0.5, 0.4, 0.1), (0.5, 0.3, 0.2)], [(0.6, 0.2, 0.2), (0.1, 0.1, 0.8)]),
]


def _soft_run(path, which):
    from fae_helpers import seal_run

    path.mkdir(parents=True)
    with (path / "claims.jsonl").open("w") as fh:
        for cid, gold, pa, pb in SOFT_CLAIMS:
            rounds = [{"round": r, "pool_ids": [0, 1], "raw_output": "...", "label": gold, "cited": [0] if r == 0 else [],
                       "hallucinated": [], "valid": True, "reused": False, "label_probs": dict(zip(LABELS, p))}
                      for r, p in enumerate(pa if which == 0 else pb)]
            fh.write(json.dumps({"id": cid, "gold_label": gold, "gold_groups": [[0]], "rounds": rounds}) + "\n")
    (path / "config.json").write_text(json.dumps({"records": "e.jsonl", "records_sha256": "ab" * 32,
                                                   "model": f"m{which}", "adapter": None, "rounds": 1}))
    return seal_run(path, metrics={"n_claims": 3, "rounds": 1})


def test_compare_adds_paired_soft_differences(tmp_path):
    from fae.ablation.runio import read_claims
    from fae.ablation.soft_metrics import soft_metrics
    from fae.cli import main

    a, b = _soft_run(tmp_path / "a", 0), _soft_run(tmp_path / "b", 1)
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "cmp"), "--bootstrap", "300"]) == 0
    res = json.loads((tmp_path / "cmp" / "compare.json").read_text())["metrics"]
    # hand values: A: E[P0(gold)] = (.8+.7+.5)/3, E[P1(gold)] = (.6+.6+.5)/3 -> soft IS = 1 - 1.7/2.0 = .15
    #              B: (.9+.8+.6)/3, (.1+.2+.1)/3 -> soft IS = 1 - .4/2.3
    assert res["soft_IS"]["A"]["estimate"] == pytest.approx(15.0)
    assert res["soft_IS"]["B"]["estimate"] == pytest.approx(100 * (1 - 0.4 / 2.3))
    assert res["soft_IS"]["difference"]["estimate"] == pytest.approx(100 * (1 - 0.4 / 2.3) - 15.0)
    assert res["nei_area"]["B"]["estimate"] == pytest.approx(100 * (0.9 + 0.8 + 0.8) / 3)
    # ECE, A: conf .8 ok (bin 8), .7 ok (bin 7), .5 ok (bin 5): (.2 + .3 + .5) / 3
    assert res["ece"]["A"]["estimate"] == pytest.approx(100 / 3)
    d = res["soft_IS"]["difference"]
    assert d["ci_low"] <= d["estimate"] <= d["ci_high"]
    # the bootstrap point estimates agree with the metrics.json definitions
    for run, key in ((a, "A"), (b, "B")):
        m = soft_metrics(read_claims(run / "claims.jsonl"))
        want = {"soft_IS": m["soft_IS"], "nei_area": m["nei_area"], "p_gold_0": m["p_gold"][0], "ece": m["ece"]}
        for name, v in want.items():
            assert res[name][key]["estimate"] == pytest.approx(100 * v)
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| soft_IS |" in md


def test_openai_server_rejecting_logprobs_is_asked_again_without_them(cc_records, tmp_path):
    from openai_server import LocalOpenAIServer

    from fae.ablation.runio import read_claims

    with LocalOpenAIServer(faults=lambda body, attempt: "400" if body.get("logprobs") else None) as srv:
        assert _openai_run(cc_records, tmp_path / "run", srv.base_url) == 0
        n400 = srv.count(outcome="400")
    assert 1 <= n400 <= 6  # only round 0 (6 claims in flight) asked for logprobs
    claims = read_claims(tmp_path / "run" / "claims.jsonl")
    assert all("label_probs" not in rd and rd["valid"] for c in claims for rd in c["rounds"])
    log = [json.loads(x) for x in (tmp_path / "run" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["backend_stats"]["label_probs_skipped"].startswith("the server rejected logprobs: HTTP 400")


@settings(derandomize=True, max_examples=60, deadline=None)
@given(label=st.sampled_from(LABELS), cuts=st.lists(st.integers(1, 40), max_size=8),
       weights=st.tuples(*[st.floats(0.01, 1.0)] * 3), spaces=st.sampled_from(["", " ", "\n  "]))
def test_top_logprobs_any_tokenization(label, cuts, weights, spaces):
    """However the answer is cut into tokens, the label token's alternatives give the normalised weights."""
    text = '{"label":' + spaces + '"' + label + '", "evidence": [1]}'
    at = text.index(label)
    bounds = sorted({c for c in cuts if 0 < c < len(text)} | {0, len(text)})
    tokens = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        piece = text[a:b]
        alts = []
        if a <= at < b:  # the label token: its head, then the start of each label
            head = text[a:at]
            alts = [(head + lab[: max(1, b - at)], math.log(w)) for lab, w in zip(LABELS, weights)]
        tokens.append((piece, alts))
    probs, _, why = label_probs_from_top_logprobs(tokens)
    assert why is None
    z = sum(weights)
    for lab, w in zip(LABELS, weights):
        assert probs[lab] == pytest.approx(w / z)


def test_label_token_scoring_reads_the_probabilities_not_the_text():
    """A verifier whose text is cut off (invalid) but whose label tokens rank gold first scores by its tokens."""
    from fae.ablation.metrics import chance_comparison
    from fae.ablation.soft_metrics import label_token_answers

    claims = [_claim("SUPPORT", [(0.7, 0.2, 0.1)]), _claim("REFUTE", [(0.2, 0.7, 0.1)]),
              _claim("REFUTE", [(0.6, 0.3, 0.1)]), _claim("SUPPORT", [(0.1, 0.2, 0.7)])]
    for c in claims:  # every generated answer invalid, as a truncated JSON is
        c["rounds"][0].update(label=None, valid=False)
    scored = label_token_answers(claims)
    assert [r["rounds"][0]["label"] for r in scored] == ["SUPPORT", "REFUTE", "SUPPORT", "NOT_ENOUGH_INFO"]
    assert chance_comparison(claims)["balanced_accuracy"] == 0.0
    assert chance_comparison(scored)["balanced_accuracy"] == pytest.approx(0.5)  # (1/2 + 1/2) / 2
    assert claims[0]["rounds"][0]["label"] is None  # the run's own answers are left alone
    no_probs = [{**claims[0], "rounds": [{"round": 0, "label": "SUPPORT", "valid": True}]}]
    assert label_token_answers(no_probs)[0]["rounds"][0]["valid"] is False
