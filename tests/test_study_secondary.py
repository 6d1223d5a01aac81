"""`fae study-report`'s secondary inference (SPEC §10), each quantity recomputed here by hand from the saved
responses of a small hand-made study: the exploratory family (E1, E_avg, endpoints, source gain under both
factors), the post-hoc family (crossed-budget components, the input-scoring interaction, the direct E1 - E0
changes), each at its own Bonferroni level with its own seeded batches; the lenient re-reading; eligibility
profiles and their gain/loss counts per claim; the identical-answer partition per claim (SciFact: all three
abstracts); the descriptive tables: each batch's endpoints (Table 27), visible vs submitted eligibility
(Figure 2), where source 1 adds eligibility (Table 9), INVALID responses cut off (Table 22) and flagged
claim-condition observations (Table 25)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fae.intervals import paired_bootstrap, pooled_paired_bootstrap
from fae.study import analysis
from fae.study import report as rep
from fae.study.interfaces import INVALID
from study_helpers import write_grid

S, R, N = "SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"
BUDGETS, FORMATS, SEEDS = (256, 2048), ("codes", "labels"), (1103, 2207)
DRAWS = 120

# Raw texts and how each reader reads them, written out by hand (FEVER strings).
STRICT = {"A": S, "B": R, "C": N, "SUPPORTS": S, "REFUTES": R, "NOT ENOUGH INFO": N}
LENIENT = {**STRICT, "a.": S, "**B**": R, "Answer: C": N, "Supports": S, "refutes.": R, "not enough info": N}
POOL = {"codes": ["A", "B", "C", "a.", "**B**", "Answer: C", "A claim", "maybe A"],
        "labels": ["SUPPORTS", "REFUTES", "NOT ENOUGH INFO", "Supports", "refutes.", "not enough info",
                   "SUPPORTS or REFUTES", "The claim is true"]}
SCIFACT = {"A": S, "B": R, "C": N, "SUPPORT": S, "CONTRADICT": R, "NOT_ENOUGH_INFO": N}


def strict_read(text):
    return STRICT.get(text, INVALID)


def lenient_read(text):
    return LENIENT.get(text, INVALID)


# ---------------------------------------------------------------- a FEVER study made by hand


def fever_units(n=10):
    """Gold S/R/N in turn; gold group [[0]] or [[0, 1]]; submitted evidence varying by source and budget."""
    units = []
    for i in range(n):
        gold = (S, R, N)[i % 3]
        subs = {"256": [[0] if i % 2 else [2], [0, 1] if i % 4 else [3]],
                "2048": [[0, 1] if i % 3 else [2], [0] if i % 5 else [0, 1]]}
        units.append({"id": f"u{i}", "claim_id": f"c{i}", "gold_label": gold,
                      "groups": [[0]] if i % 2 else [[0, 1]], "submitted": subs})
    return units


def random_raw(seed):
    rng = np.random.default_rng(seed)
    table = {}

    def raw(uid, s, b, f, r):
        key = (uid, s, b, f, r)
        if key not in table:
            table[key] = POOL[f][int(rng.integers(len(POOL[f])))]
        return table[key]
    return raw


def fever_shown(u, s, b):
    """What each presentation showed: the submitted prefix, then either the gold ids 0 and 1 (so a complete
    group is visible where the prefix misses it) or an id no group holds."""
    extra = [0, 1] if (int(u["id"][1:]) + s + (b == 2048)) % 3 == 0 else [9]
    sub = u["submitted"][str(b)][s]
    return sub + [i for i in extra if i not in sub]


def fever_finish(uid, s, b, f, r):
    """Cut off at the generation limit on every third condition, valid answers and INVALID ones alike."""
    return "length" if (int(uid[1:]) + s + r + (b == 2048)) % 3 == 0 else "stop"


@pytest.fixture(scope="module")
def fever(tmp_path_factory):
    """One FEVER panel: its directory, the raw texts, the report (small draws) and the report's JSON."""
    tmp = tmp_path_factory.mktemp("fever")
    units = fever_units()
    raw = random_raw(3)
    study = write_grid(tmp / "study", units, raw, seeds=SEEDS, shown=fever_shown, finish=fever_finish,
                       max_new_tokens=16)
    res = rep.run(rep.StudyReportConfig(studies=[str(study)], output=str(tmp / "out"), draws=DRAWS,
                                        exploratory_draws=DRAWS, post_hoc_draws=DRAWS + 20))
    return {"dir": study, "units": units, "raw": raw, "report": res.summary,
            "json": json.loads((tmp / "out" / "study_report.json").read_text()),
            "md": (tmp / "out" / "study_report.md").read_text()}


def eligible_by_hand(submitted, groups, gold, nei_needs_nothing=True):
    if gold == N and nei_needs_nothing:
        return 1.0
    return float(any(set(g) <= set(submitted) for g in groups if g))


def strict_cells(units, read, f, u, v, r):
    """S_ab (a: answers of source a generated at input budget u; b: evidence of source b at scoring budget v)."""
    out = {}
    for a in (0, 1):
        for e in (0, 1):
            hits = [float(read(x["id"], a, u, f, r) == x["gold_label"])
                    * eligible_by_hand(x["submitted"][str(v)][e], x["groups"], x["gold_label"]) for x in units]
            out[f"S{a}{e}"] = 100.0 * sum(hits) / len(units)
    return out


def quantities(c):
    e0, e1 = c["S01"] - c["S00"], c["S11"] - c["S10"]
    return {"E0": e0, "E1": e1, "E_avg": (e0 + e1) / 2, "S00": c["S00"], "S11": c["S11"], "G": c["S11"] - c["S00"],
            "E1-E0": e1 - e0}


def seed_mean(fn):
    return float(np.mean([fn(r) for r in range(1, len(SEEDS) + 1)]))


def by_hand(units, read, cells=strict_cells):
    """Every secondary comparison, recomputed from the answers: per sampled seed, then averaged over seeds."""
    s, l = BUDGETS

    def q(f, u, v, r, name):
        return quantities(cells(units, read, f, u, v, r))[name]

    out = {}
    for name in ("E0", "E1", "E_avg", "S00", "S11", "G", "E1-E0"):
        out[f"D_context/{name}"] = seed_mean(lambda r: np.mean([q(f, l, l, r, name) - q(f, s, s, r, name)
                                                                for f in FORMATS]))
        out[f"D_format/{name}"] = seed_mean(lambda r: np.mean([q("labels", b, b, r, name) - q("codes", b, b, r, name)
                                                               for b in BUDGETS]))

    def t(u, v, r):
        return np.mean([q(f, u, v, r, "E0") for f in FORMATS])
    out["crossing/input_first.input"] = seed_mean(lambda r: t(l, s, r) - t(s, s, r))
    out["crossing/input_first.scoring"] = seed_mean(lambda r: t(l, l, r) - t(l, s, r))
    out["crossing/scoring_first.scoring"] = seed_mean(lambda r: t(s, l, r) - t(s, s, r))
    out["crossing/scoring_first.input"] = seed_mean(lambda r: t(l, l, r) - t(s, l, r))
    out["crossing/interaction"] = seed_mean(lambda r: t(l, l, r) - t(l, s, r) - t(s, l, r) + t(s, s, r))
    return out


def reader(raw, parse):
    return lambda uid, s, b, f, r: parse(raw(uid, s, b, f, r))


EXPLORATORY = [f"{f}/{q}" for f in ("D_format", "D_context") for q in ("E1", "E_avg", "S00", "S11", "G")]
POST_HOC = ["crossing/input_first.input", "crossing/input_first.scoring", "crossing/scoring_first.scoring",
            "crossing/scoring_first.input", "crossing/interaction", "D_context/E1-E0", "D_format/E1-E0"]


def test_exploratory_family_is_e1_e_avg_endpoints_and_gain_under_both_factors(fever):
    hand = by_hand(fever["units"], reader(fever["raw"], strict_read))
    (panel,) = fever["json"]["panels"]
    got = panel["exploratory"]["values"]
    assert sorted(got) == sorted(EXPLORATORY)  # none dropped, none added
    for name in EXPLORATORY:
        assert got[name]["estimate"] == pytest.approx(hand[name], abs=1e-9), name
    # the hand-made study tells the scopes apart: E1 is not E0, E_avg is neither
    assert hand["D_context/E1"] != pytest.approx(hand["D_context/E0"])
    assert hand["D_context/E_avg"] != pytest.approx(hand["D_context/E1"])
    assert hand["D_format/E_avg"] != pytest.approx(hand["D_format/E1"])
    assert "| fever | m | D_context/E_avg |" in fever["md"] and "Exploratory family" in fever["md"]


def test_post_hoc_family_is_the_crossing_its_interaction_and_the_e1_minus_e0_changes(fever):
    hand = by_hand(fever["units"], reader(fever["raw"], strict_read))
    (panel,) = fever["json"]["panels"]
    got = panel["post_hoc"]["values"]
    assert sorted(got) == sorted(POST_HOC)
    for name in POST_HOC:
        assert got[name]["estimate"] == pytest.approx(hand[name], abs=1e-9), name
    assert hand["crossing/interaction"] != pytest.approx(0.0)
    # the interaction is the difference between the orders' components
    assert got["crossing/interaction"]["estimate"] == pytest.approx(
        got["crossing/input_first.scoring"]["estimate"] - got["crossing/scoring_first.scoring"]["estimate"])
    assert "| fever | m | crossing/interaction |" in fever["md"] and "Post-hoc family" in fever["md"]


@pytest.mark.parametrize("family, k, stream, draws", [("exploratory", 10, 1, DRAWS), ("post_hoc", 7, 2, DRAWS + 20)])
def test_each_family_has_its_own_level_draws_and_seed(fever, family, k, stream, draws):
    """K = the family's comparisons in this study (10 exploratory, 7 post hoc for one panel with both
    formats and both budgets), tails 0.05/(2K); the draws are the family's option's; the batch seed is
    SeedSequence(--seed, spawn_key=(stream, 0)); the interval is the percentile at that level of those draws."""
    rec = fever["json"]["secondary"][family]
    assert rec["comparisons"] == k and rec["paper_comparisons"] == {"exploratory": 60, "post_hoc": 42}[family]
    assert rec["tail"] == pytest.approx(0.05 / (2 * k)) and rec["confidence"] == pytest.approx(1 - 0.05 / k)
    seed = int(np.random.SeedSequence(20260916, spawn_key=(stream, 0)).generate_state(1)[0])
    assert rec["batches"] == [{"draws": draws, "seed": seed}]
    panel = rep.panel_of(rep.load_study(fever["dir"]), rep.family_mapper(None)[0])
    names = analysis.family_names(panel, family)
    direct = paired_bootstrap(panel.sums[:, 1:, :], analysis.family_statistic(panel, names), n_resamples=draws, seed=seed,
                              confidence=1 - 0.05 / k, batch_draws=analysis.secondary_compute_batch(panel))
    got = fever["json"]["panels"][0][family]["values"]
    widths = [got[n]["ci_high"] - got[n]["ci_low"] for n in names]
    assert any(w > 0 for w in widths)
    for i, n in enumerate(names):
        assert (got[n]["ci_low"], got[n]["ci_high"]) == pytest.approx((direct.ci_low[i], direct.ci_high[i])), n
    # the primary level (K = 2 for one panel) gives narrower intervals than the family's own
    primary = paired_bootstrap(panel.sums[:, 1:, :], analysis.family_statistic(panel, names), n_resamples=draws, seed=seed,
                               confidence=1 - 0.05 / 2, batch_draws=analysis.secondary_compute_batch(panel))
    assert any(primary.ci_high[i] - primary.ci_low[i] < widths[i] - 1e-9 for i in range(len(names)))


def test_a_familys_draws_come_in_independently_seeded_batches_pooled(fever, monkeypatch):
    """Draws beyond one batch are split (the paper: four 250,000-draw batches of its million), each batch seeded
    SeedSequence(seed, spawn_key=(stream, b)), and the percentile taken over the pooled draws."""
    monkeypatch.setattr(analysis, "SECONDARY_BATCH_DRAWS", 50)
    panel = rep.panel_of(rep.load_study(fever["dir"]), rep.family_mapper(None)[0])
    got = analysis.analyse_family(panel, "post_hoc", 7, 120, seed=5)
    seeds = [int(np.random.SeedSequence(5, spawn_key=(2, b)).generate_state(1)[0]) for b in range(3)]
    assert analysis.family_batches("post_hoc", 120, 5) == list(zip([50, 50, 20], seeds))
    names = analysis.family_names(panel, "post_hoc")
    stat = analysis.family_statistic(panel, names)
    pool = np.concatenate([paired_bootstrap(panel.sums[:, 1:, :], stat, n_resamples=n, seed=s, keep_distribution=True,
                                            batch_draws=analysis.secondary_compute_batch(panel)).distribution
                           for n, s in zip([50, 50, 20], seeds)], axis=1)
    assert pool.shape == (len(names), 120)
    lo, hi = np.quantile(pool, [0.05 / 14, 1 - 0.05 / 14], axis=1)
    for i, n in enumerate(names):
        assert (got["values"][n]["ci_low"], got["values"][n]["ci_high"]) == pytest.approx((lo[i], hi[i])), n
    one = pooled_paired_bootstrap(panel.sums[:, 1:, :], stat, batches=[(120, seeds[0])], confidence=1 - 0.05 / 7,
                                  batch_draws=analysis.secondary_compute_batch(panel))
    assert not np.allclose(one.ci_low, lo) or not np.allclose(one.ci_high, hi)  # pooling is not one long batch


def test_each_batchs_own_endpoints_at_the_familys_level_without_drawing_again(fever, monkeypatch):
    """Table 27: per comparison, every batch's lower and upper percentile endpoints at the family's tail
    (0.05/(2K), K = 7 here), from the batch's own draws, beside the pooled interval; the family draws each
    batch once (one paired_bootstrap per batch, as many statistic calls as without the endpoints)."""
    import fae.intervals as intervals

    monkeypatch.setattr(analysis, "SECONDARY_BATCH_DRAWS", 50)
    panel = rep.panel_of(rep.load_study(fever["dir"]), rep.family_mapper(None)[0])
    names = analysis.family_names(panel, "post_hoc")
    stat = analysis.family_statistic(panel, names)
    batches = analysis.family_batches("post_hoc", 120, 5)
    dists = [paired_bootstrap(panel.sums[:, 1:, :], stat, n_resamples=n, seed=s, keep_distribution=True,
                              batch_draws=analysis.secondary_compute_batch(panel)).distribution for n, s in batches]
    calls = []
    real = intervals.paired_bootstrap
    monkeypatch.setattr(intervals, "paired_bootstrap", lambda *a, **k: calls.append(k["n_resamples"]) or real(*a, **k))
    got = analysis.analyse_family(panel, "post_hoc", 7, 120, seed=5)
    assert calls == [50, 50, 20]  # each batch drawn once: the endpoints reuse its draws
    assert sorted(got["batch_endpoints"]) == sorted(names)
    spread = False
    for i, n in enumerate(names):
        ends = got["batch_endpoints"][n]
        assert len(ends) == 3
        for b, dist in enumerate(dists):
            lo, hi = np.quantile(dist[i], [0.05 / 14, 1 - 0.05 / 14])
            assert (ends[b]["ci_low"], ends[b]["ci_high"]) == pytest.approx((lo, hi)), (n, b)
            primary = np.quantile(dist[i], [0.05 / 4, 1 - 0.05 / 4])  # one panel's primary K = 2
            spread |= not np.allclose(primary, (lo, hi))
        assert ends[0] != ends[1] or ends[0]["ci_low"] == ends[0]["ci_high"]
    assert spread  # the primary level would give other endpoints here
    # the report: one batch per family at these draws, whose endpoints are the pooled interval itself
    for family in ("exploratory", "post_hoc"):
        p = fever["json"]["panels"][0][family]
        for name, v in p["values"].items():
            assert p["batch_endpoints"][name] == [{"ci_low": v["ci_low"], "ci_high": v["ci_high"]}], name
    assert "Monte Carlo batches of the secondary families (post hoc" in fever["md"]
    assert "| fever | m | post hoc | crossing/interaction |" in fever["md"]


def test_lenient_re_reading_recomputes_the_primary_contrasts_and_invalid_rates(fever):
    (panel,) = fever["json"]["panels"]
    strict = by_hand(fever["units"], reader(fever["raw"], strict_read))
    lenient = by_hand(fever["units"], reader(fever["raw"], lenient_read))
    got = panel["lenient"]["contrasts"]
    assert sorted(got) == ["D_context", "D_format"]
    for name in ("D_format", "D_context"):
        assert got[name]["strict"] == pytest.approx(strict[f"{name}/E0"], abs=1e-9)
        assert got[name]["lenient"] == pytest.approx(lenient[f"{name}/E0"], abs=1e-9)
        assert got[name]["strict"] == pytest.approx(panel["values"][name]["estimate"])
    assert any(lenient[f"{n}/E0"] != pytest.approx(strict[f"{n}/E0"]) for n in ("D_format", "D_context"))
    for f in FORMATS:
        texts = [fever["raw"](u["id"], s, b, f, r) for u in fever["units"] for s in (0, 1) for b in BUDGETS
                 for r in range(len(SEEDS) + 1)]
        row = panel["lenient"]["invalid"][f]
        assert row["responses"] == len(texts) and row["no_raw_text"] == 0
        assert row["strict_invalid_rate"] == pytest.approx(100 * np.mean([strict_read(t) == INVALID for t in texts]))
        assert row["lenient_invalid_rate"] == pytest.approx(100 * np.mean([lenient_read(t) == INVALID for t in texts]))
        assert row["lenient_invalid_rate"] < row["strict_invalid_rate"]
    assert "Lenient re-reading (sensitivity check" in fever["md"]


def test_lenient_reader_reads_variants_and_refuses_ambiguity():
    from fae.study.interfaces import FORMATS as F
    for f, texts in POOL.items():
        for text in texts:
            assert F[f].parse_lenient(text, "fever") == lenient_read(text), text
            assert F[f].parse(text, "fever") == strict_read(text), text  # the study's reader stays strict
    for f, text in (("codes", "A?"), ("codes", ""), ("labels", "REFUTES, not SUPPORTS"), ("labels", "SUPPORTS?")):
        assert F[f].parse_lenient(text, "fever") == INVALID, text
    assert F["labels"].parse_lenient("Not enough info", "scifact") == N


def test_eligibility_profiles_per_source_and_budget_with_gains_and_losses(fever):
    units = fever["units"]
    got = fever["json"]["eligibility"]["fever"]
    count = {(s, b): [eligible_by_hand(u["submitted"][str(b)][s], u["groups"], u["gold_label"]) for u in units]
             for s in (0, 1) for b in BUDGETS}
    for row in got["profiles"]:
        c = count[(row["source"], row["budget"])]
        assert row["claims"] == len(units) and row["eligible"] == sum(c) and row["per_claim"] == pytest.approx(np.mean(c))
    gain = loss = mixed = 0
    for i in range(len(units)):
        up = any(count[(1, b)][i] > count[(0, b)][i] for b in BUDGETS)
        down = any(count[(1, b)][i] < count[(0, b)][i] for b in BUDGETS)
        gain += up and not down
        loss += down and not up
        mixed += up and down
    assert got["changes"] == {"gain": gain, "loss": loss, "mixed": mixed, "unchanged": len(units) - gain - loss - mixed}
    assert gain and loss


# ---------------------------------------------------------------- SciFact: per claim, three abstracts


def scifact_units():
    """Four claims x three abstracts. Gold rationale [[0, 1]] on a claim's first two abstracts (S, then R), the
    third NEI. Source 1 submits the rationale complete more often; claim c3 gains at 256 and loses at 2048."""
    units = []
    for c in range(4):
        for d in range(3):
            gold = (S, R, N)[d]
            full, part = [0, 1], [0]
            s0 = {"256": part if (c + d) % 2 else full, "2048": full if d == 0 else part}
            s1 = {"256": full, "2048": full if (c, d) != (3, 0) else part}
            if c == 3 and d == 1:
                s0, s1 = {"256": part, "2048": part}, {"256": full, "2048": part}
            units.append({"id": f"c{c}-d{d}", "claim_id": f"c{c}", "gold_label": gold,
                          "groups": [[0, 1]] if gold != N else [],
                          "submitted": {b: [s0[b], s1[b]] for b in ("256", "2048")}})
    return units


def scifact_raw(uid, s, b, f, r):
    """Claim c0: every abstract the same valid answer under both sources. Claim c1: two abstracts the same, the
    third differs between sources (so per abstract two are identical, per claim none). c2, c3 seeded."""
    claim, d = int(uid[1]), int(uid[-1])
    codes = f == "codes"
    right = ("A", "B", "C")[d] if codes else ("SUPPORT", "CONTRADICT", "NOT_ENOUGH_INFO")[d]
    if claim == 0:
        return right
    if claim == 1:
        return right if d < 2 or s == 0 else ("A" if codes else "SUPPORT")
    rng = np.random.default_rng([claim, d, s, b, r, int(codes)])
    x = rng.random()
    return right if x < 0.6 else ("B" if codes else "CONTRADICT") if x < 0.85 else "maybe"  # "maybe": INVALID


def scifact_shown(u, s, b):
    """The submitted sentences, then sentence 1 on every other claim x source (a complete rationale [0, 1]
    visible where only [0] is submitted), else a sentence outside every rationale."""
    extra = 1 if (int(u["claim_id"][1:]) + s) % 2 == 0 else 5
    sub = u["submitted"][str(b)][s]
    return sub + ([extra] if extra not in sub else [])


@pytest.fixture(scope="module")
def scifact(tmp_path_factory):
    """The SciFact panel (four claims x three abstracts, one gold abstract of c2 missed): units, report, markdown.
    Its lines record what was shown but no finish reason."""
    tmp = tmp_path_factory.mktemp("scifact")
    units = scifact_units()
    study = write_grid(tmp / "sf", units, scifact_raw, dataset="scifact", seeds=SEEDS, missed={"c2": 1},
                       shown=scifact_shown)
    res = rep.run(rep.StudyReportConfig(studies=[str(study)], output=str(tmp / "out"), draws=20,
                                        exploratory_draws=20, post_hoc_draws=20))
    return {"units": units, "report": res.summary, "md": (tmp / "out" / "study_report.md").read_text()}


def scifact_read(uid, s, b, f, r):
    return SCIFACT.get(scifact_raw(uid, s, b, f, r), INVALID)


def f1_parts(units, read, f, u, v, r, missed, per_claim=True):
    """Corpus F1 cells and the identical-claim parts of E0 and E1, from the answers (hand, per claim; with
    ``per_claim`` False each abstract alone, the wrong scope)."""
    rel = [x for x in units if x["gold_label"] in (S, R)]
    big_r = len(rel) + missed
    ans = {(x["id"], a): read(x["id"], a, u, f, r) for x in units for a in (0, 1)}
    p = {a: sum(ans[(x["id"], a)] in (S, R) for x in units) for a in (0, 1)}
    ok = {(x["id"], a): float(x["gold_label"] in (S, R) and ans[(x["id"], a)] == x["gold_label"])
          for x in units for a in (0, 1)}
    d = {(x["id"], e): eligible_by_hand(x["submitted"][str(v)][e], x["groups"], x["gold_label"], False)
         for x in units for e in (0, 1)}
    cells = {f"S{a}{e}": 200.0 * sum(ok[(x["id"], a)] * d[(x["id"], e)] for x in units) / (p[a] + big_r)
             for a in (0, 1) for e in (0, 1)}
    claims = sorted({x["claim_id"] for x in units})
    same = {c: all(ans[(x["id"], 0)] == ans[(x["id"], 1)] != INVALID for x in units if x["claim_id"] == c)
            for c in claims}
    kept = [x for x in units if (same[x["claim_id"]] if per_claim else ans[(x["id"], 0)] == ans[(x["id"], 1)] != INVALID)]
    part = {a: 200.0 * sum(ok[(x["id"], a)] * (d[(x["id"], 1)] - d[(x["id"], 0)]) for x in kept) / (p[a] + big_r)
            for a in (0, 1)}
    return cells, {"E0": part[0], "E1": part[1], "identical_claims": 100.0 * sum(same.values()) / len(claims)}


def test_scifact_partition_is_per_claim_in_every_condition(scifact):
    units, res = scifact["units"], scifact["report"]
    (panel,) = res["panels"]
    got = panel["partition"]
    assert got["claims"] == 4
    read = scifact_read

    for f in FORMATS:
        for b in BUDGETS:
            row = got["conditions"][f"{f}/{b}"]
            per = [f1_parts(units, read, f, b, b, r, 1) for r in range(1, len(SEEDS) + 1)]
            e0 = np.mean([c["S01"] - c["S00"] for c, _ in per])
            e1 = np.mean([c["S11"] - c["S10"] for c, _ in per])
            assert row["identical_claims"] == pytest.approx(np.mean([p["identical_claims"] for _, p in per]))
            assert row["E0"]["identical"] == pytest.approx(np.mean([p["E0"] for _, p in per]), abs=1e-9), (f, b)
            assert row["E1"]["identical"] == pytest.approx(np.mean([p["E1"] for _, p in per]), abs=1e-9), (f, b)
            assert row["E0"]["total"] == pytest.approx(e0, abs=1e-9) and row["E1"]["total"] == pytest.approx(e1, abs=1e-9)
            assert row["E0"]["identical"] + row["E0"]["changed"] == pytest.approx(e0, abs=1e-9)
    # the scope matters here: c1's two matching abstracts would count alone, and their evidence changes at 256
    per_abstract = np.mean([f1_parts(units, read, "codes", 256, 256, r, 1, per_claim=False)[1]["E0"]
                            for r in range(1, len(SEEDS) + 1)])
    assert got["conditions"]["codes/256"]["E0"]["identical"] != pytest.approx(per_abstract)
    # SciFact's eligibility profile counts eligible retrieved abstracts per claim, gains and losses per claim
    prof = res["eligibility"]["scifact"]
    for row in prof["profiles"]:
        n = sum(eligible_by_hand(x["submitted"][str(row["budget"])][row["source"]], x["groups"], x["gold_label"],
                                 False) for x in units)
        assert row["claims"] == 4 and row["eligible"] == n and row["per_claim"] == pytest.approx(n / 4)
    assert prof["changes"]["mixed"] == 1 and "c3" not in prof["gain_claims"] + prof["loss_claims"]
    assert sum(prof["changes"].values()) == 4


# ---------------------------------------------------------------- the descriptive tables (Tables 9, 22, 25, 27, Figure 2)


def claim_counts(units, evidence, nei_eligible):
    """claim -> {(source, budget): eligible units}, by hand."""
    count = {}
    for x in units:
        row = count.setdefault(x["claim_id"], {(s, b): 0.0 for s in (0, 1) for b in BUDGETS})
        for s in (0, 1):
            for b in BUDGETS:
                row[(s, b)] += eligible_by_hand(evidence(x, s, b), x["groups"], x["gold_label"], nei_eligible)
    return count


def submitted(x, s, b):
    return x["submitted"][str(b)][s]


def e0_part(units, read, f, u, v, r, members, metric, missed=0):
    """The members' part of E0 (source-0 answers at input budget u, evidence at scoring budget v) on the full
    denominator: strict 100/n, F1 200/(P0 + R) over every unit (R with the missed gold abstracts)."""
    strict = metric == "strict"
    if strict:
        scale = 100.0 / len(units)
    else:
        p0 = sum(read(x["id"], 0, u, f, r) in (S, R) for x in units)
        scale = 200.0 / (p0 + sum(x["gold_label"] in (S, R) for x in units) + missed)
    total = 0.0
    for x in members:
        a = read(x["id"], 0, u, f, r) == x["gold_label"] and (strict or x["gold_label"] in (S, R))
        d = [eligible_by_hand(x["submitted"][str(v)][e], x["groups"], x["gold_label"], strict) for e in (0, 1)]
        total += a * (d[1] - d[0])
    return scale * total


def check_added_eligibility(units, read, panel, metric, missed=0):
    """Table 9 by hand: the claims where source 1 adds eligibility at each extreme budget, both and the union;
    the union's accuracies and its and the other claims' parts of E0 and of the input component."""
    got = panel["added_eligibility"]
    small, large = BUDGETS
    count = claim_counts(units, submitted, metric == "strict")
    adds = {b: {c for c, n in count.items() if n[(1, b)] > n[(0, b)]} for b in BUDGETS}
    union = adds[small] | adds[large]
    assert union != adds[small] & adds[large]  # the fixture tells the union from the intersection
    assert (got["claims"], got["adds_smallest"], got["adds_largest"], got["adds_both"], got["union"]) == (
        len(count), len(adds[small]), len(adds[large]), len(adds[small] & adds[large]), len(union))
    assert got["union_claims"] == sorted(union) and got["decoding"] == "sampled"
    members = [x for x in units if x["claim_id"] in union]
    others = [x for x in units if x["claim_id"] not in union]
    sampled = range(1, len(SEEDS) + 1)

    def part(group, u, v):
        return np.mean([e0_part(units, read, f, u, v, r, group, metric, missed) for f in FORMATS for r in sampled])

    for b in BUDGETS:
        for src in (0, 1):
            acc = 100 * np.mean([read(x["id"], src, b, f, r) == x["gold_label"]
                                 for x in members for f in FORMATS for r in sampled])
            assert got["accuracy"][f"source{src}"][str(b)] == pytest.approx(acc), (src, b)
        e = got["E0"][str(b)]
        assert e["group"] == pytest.approx(part(members, b, b), abs=1e-9), b
        assert e["rest"] == pytest.approx(part(others, b, b), abs=1e-9), b
        assert e["total"] == pytest.approx(e["group"] + e["rest"], abs=1e-9)
        assert e["total"] == pytest.approx(panel["values"][f"budget/{b}/E0"]["estimate"], abs=1e-9)
        i = got["input_component"][str(b)]
        assert i["group"] == pytest.approx(part(members, large, b) - part(members, small, b), abs=1e-9), b
        assert i["rest"] == pytest.approx(part(others, large, b) - part(others, small, b), abs=1e-9), b
        assert i["total"] == pytest.approx(i["group"] + i["rest"], abs=1e-9)
    # the crossing's input components are the whole's, at the smallest and the largest scoring budget
    v = panel["post_hoc"]["values"]
    assert got["input_component"][str(small)]["total"] == pytest.approx(v["crossing/input_first.input"]["estimate"])
    assert got["input_component"][str(large)]["total"] == pytest.approx(v["crossing/scoring_first.input"]["estimate"])
    assert any(got["E0"][str(b)]["group"] for b in BUDGETS)
    return got


def test_where_source_1_adds_eligibility_fever(fever):
    check_added_eligibility(fever["units"], reader(fever["raw"], strict_read), fever["json"]["panels"][0], "strict")
    assert "Where source 1 adds eligibility (post hoc" in fever["md"]


def test_where_source_1_adds_eligibility_scifact_counts_abstracts_and_f1_denominators(scifact):
    got = check_added_eligibility(scifact["units"], scifact_read, scifact["report"]["panels"][0], "f1", missed=1)
    assert got["union_units"] == 3 * got["union"]  # every abstract of a union claim
    assert "| scifact | m | 4 |" in scifact["md"]


def invalid_lines(units, read_text, f, reps):
    return [(x["id"], s, b, f, r) for x in units for s in (0, 1) for b in BUDGETS for r in reps
            if read_text(x["id"], s, b, f, r) == INVALID]


def test_invalid_responses_cut_off_at_the_generation_limit(fever, scifact):
    """Table 22: among INVALID primary responses (not all responses), those with finish_reason "length"."""
    got = fever["json"]["panels"][0]["truncation"]
    assert got["max_new_tokens"] == 16
    read = reader(fever["raw"], strict_read)
    for f in FORMATS:
        for scope, reps in (("sampled", range(1, len(SEEDS) + 1)), ("all", range(len(SEEDS) + 1))):
            bad = invalid_lines(fever["units"], read, f, reps)
            cut = [k for k in bad if fever_finish(*k) == "length"]
            row = got["formats"][f][scope]
            assert (row["invalid"], row["length"], row["unknown"]) == (len(bad), len(cut), 0), (f, scope)
            assert row["length_share"] == pytest.approx(100 * len(cut) / len(bad))
    # the fixture tells the scopes apart: valid responses are cut off too, and greedy adds INVALID ones
    assert any(fever_finish(x["id"], s, b, f, r) == "length" and read(x["id"], s, b, f, r) != INVALID
               for x in fever["units"] for s in (0, 1) for b in BUDGETS for f in FORMATS for r in range(3))
    assert any(got["formats"][f]["all"]["invalid"] > got["formats"][f]["sampled"]["invalid"] for f in FORMATS)
    assert "INVALID responses cut off at the generation limit" in fever["md"]
    # no finish reason saved: counted unknown, never cut off
    sf = scifact["report"]["panels"][0]["truncation"]
    assert sf["max_new_tokens"] is None
    for f in FORMATS:
        row = sf["formats"][f]["all"]
        assert row["length"] == 0 and row["unknown"] == row["invalid"] == len(invalid_lines(
            scifact["units"], scifact_read, f, range(len(SEEDS) + 1)))


def check_observations(units, read, got):
    """Table 25 by hand: claim x budget x replicate, flagged when any unit of the claim under either source
    answered INVALID."""
    claims = sorted({x["claim_id"] for x in units})
    for f in FORMATS:
        for scope, reps in (("sampled", range(1, len(SEEDS) + 1)), ("all", range(len(SEEDS) + 1))):
            flags = [any(read(x["id"], s, b, f, r) == INVALID for x in units if x["claim_id"] == c for s in (0, 1))
                     for c in claims for b in BUDGETS for r in reps]
            row = got[f][scope]
            assert (row["observations"], row["flagged"]) == (len(flags), sum(flags)), (f, scope)
            assert row["rate"] == pytest.approx(100 * np.mean(flags))
            # per response would be another rate: the fixture has observations with two INVALID answers
            per_response = len(invalid_lines(units, read, f, reps)) / (len(units) * 2 * len(BUDGETS) * len(reps))
            assert row["rate"] != pytest.approx(100 * per_response)


def test_claim_condition_observations_with_an_invalid_response(fever, scifact):
    check_observations(fever["units"], reader(fever["raw"], strict_read), fever["json"]["panels"][0]["invalid_observations"])
    check_observations(scifact["units"], scifact_read, scifact["report"]["panels"][0]["invalid_observations"])
    assert "Claim-condition observations with an INVALID response" in fever["md"]


def check_visible(units, shown, elig, metric):
    """Figure 2 / Appendix J by hand: the profile on what was shown beside the one on what was submitted, and
    the presentations whose shown evidence holds a complete gold group that the submitted prefix lacks."""
    nei = metric == "strict"
    visible = claim_counts(units, shown, nei)
    scored = claim_counts(units, submitted, nei)
    for row in elig["visible"]["profiles"]:
        key = (row["source"], row["budget"])
        assert row["eligible"] == sum(c[key] for c in visible.values()), key
        assert row["per_claim"] == pytest.approx(np.mean([c[key] for c in visible.values()]))
    for row in elig["profiles"]:
        assert row["eligible"] == sum(c[(row["source"], row["budget"])] for c in scored.values())
    assert elig["evidence"] == "submitted" and elig["visible"]["profiles"] != elig["profiles"]
    rows = {(r["source"], r["budget"]): r for r in elig["visible_not_submitted"]["conditions"]}
    total = 0
    for s in (0, 1):
        for b in BUDGETS:
            n = sum(eligible_by_hand(shown(x, s, b), x["groups"], x["gold_label"], nei)
                    and not eligible_by_hand(submitted(x, s, b), x["groups"], x["gold_label"], nei) for x in units)
            assert rows[(s, b)] == {"source": s, "budget": b, "presentations": len(units), "count": n}
            total += n
    assert elig["visible_not_submitted"]["count"] == total > 0
    assert elig["visible_not_submitted"]["presentations"] == 4 * len(units)


def test_visible_and_submitted_eligibility(fever, scifact):
    check_visible(fever["units"], fever_shown, fever["json"]["eligibility"]["fever"], "strict")
    check_visible(scifact["units"], scifact_shown, scifact["report"]["eligibility"]["scifact"], "f1")
    assert "Eligible, visible" in fever["md"] and "Shown, not submitted" in fever["md"]


def test_a_study_without_shown_evidence_has_no_visible_profile(tmp_path):
    study = write_grid(tmp_path / "s", fever_units(), random_raw(4), seeds=SEEDS)
    res = rep.run(rep.StudyReportConfig(studies=[str(study)], output=str(tmp_path / "out"), draws=20,
                                        exploratory_draws=20, post_hoc_draws=20))
    elig = res.summary["eligibility"]["fever"]
    assert elig["visible"] is None and elig["visible_not_submitted"] is None and elig["profiles"]
