"""`fae view` of the sufficiency arms (cited-only pools, the size sweep) and the control matched on the gap.

Two real `fae run`s against a verifier behind a local OpenAI-compatible server (tests/control_helpers.py):
run "suff" asks every arm; run "plain" is made with --no-cited-only --no-size-sweep. The verifier differs by
claim, so the arms' codes, counts and filters tell claims apart:

- claim numbers 0 and 3 abstain on any pool of at most two lines (a size cue): NOT_ENOUGH_INFO on their
  cited-only pool (the gold line alone) and on the sweep's pools k = 0 and 1;
- numbers 1 and 4 read their evidence: right on every pool that holds the proving line;
- numbers 2 and 5 answer SUPPORT citing nothing: their cited-only pool is left out;
- claim "only" has a pool of its gold line alone: left out of the sweep.

The index and the shards are checked against claims.jsonl and metrics.json; view.js itself runs under
node with the minimal DOM of tests/test_view.py (skipped without node): the run table's cells and the
claims behind each link, the two filters, the chips, and the claim page's cited-only and sweep panels
(struck lines, labels, lines added) and the control's gap-matched note. One slow test opens a claim page
in headless Chromium (tests/test_view_browser.py's fixtures: skipped without it): every sweep pool is on
the page, the lines not in it struck through (computed style).
"""

from __future__ import annotations

import json

import pytest
from control_helpers import ENV, KEY, PROOF, answer, records, run_with
from helpers import make_record_dict
from openai_server import claim_of, pool_lines
from view_helpers import chromium, render, screens  # noqa: F401  (fixtures: the browser, where screenshots go)

from data_prep.records import ClaimRecord, save_records
from fae.ablation.engine import removal_gap
from fae.ablation.scores import round_label
from fae.cli import main as fae
from fae.view.data import arm_metrics, build_view, load_view_runs, run_entry

CODE = {"SUPPORT": "S", "REFUTE": "R", "NOT_ENOUGH_INFO": "N", None: "x"}


def by_claim(body: dict) -> str:
    """The verifier of the module docstring: its behaviour depends on the claim's number."""
    lines = pool_lines(body)
    proof = [i for i, text in lines.items() if text == PROOF]
    number = claim_of(body).rsplit(" ", 1)[-1]
    kind = int(number) % 3 if number.isdigit() else 1
    if kind == 2:
        return answer("SUPPORT")
    if kind == 0 and len(lines) <= 2:
        return answer("NOT_ENOUGH_INFO")
    return answer("SUPPORT", proof) if proof else answer("NOT_ENOUGH_INFO")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suff")
    only_gold = ClaimRecord.from_dict(make_record_dict(id="only", claim="claim only", label="SUPPORT",
                                                       evidence=[[0]], sentences=[{"id": 0, "text": PROOF}]))
    path = tmp / "records.jsonl"
    save_records([*records(6), only_gold], path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, KEY)
        m, claims = run_with(by_claim, path, tmp / "suff")
        run_with(by_claim, path, tmp / "plain", "--no-cited-only", "--no-size-sweep")
    return tmp, m, claims


def code(rnd) -> str:
    return "-" if not rnd or "skipped" in rnd else CODE.get(round_label(rnd), "?")


def test_the_index_and_shards_carry_the_cited_only_and_sweep_answers(runs):
    tmp, m, claims = runs
    view_runs = load_view_runs([tmp / "suff", tmp / "plain"], ["suff", "plain"])
    index, shards = build_view(view_runs, shard_size=3)
    ids = index["claims"]["id"]
    assert ids == ["c00", "c01", "c02", "c03", "c04", "c05", "only"]
    A, B = index["answers"]
    # the codes against claims.jsonl, and what the verifier of each claim does
    assert A["cited_only"] == [code(c["cited_only"]) for c in claims] == ["N", "S", "-", "N", "S", "-", "S"]
    sweeps = ["".join(code(rd) for rd in c["size_sweep"]["rounds"]) if "rounds" in c["size_sweep"] else "-"
              for c in claims]
    assert A["sweep"] == sweeps == ["NNSSS", "SSSSS", "SSSSS", "NNSSS", "SSSSS", "SSSSS", "-"]
    assert B["cited_only"] == B["sweep"] == [""] * 7  # --no-cited-only --no-size-sweep
    # a second measure of metrics.json: the counts the filters and links read
    cited, sweep = m["cited_only"], m["size_sweep"]
    assert sum(c == "N" for c in A["cited_only"]) == round(cited["nei_answer_rate"] * cited["n_claims"]) == 2
    assert sum(c == "-" for c in A["cited_only"]) == cited["n_skipped"] == 2
    for row in sweep["per_k"]:
        right = sum(s[row["k"]:row["k"] + 1] == "S" for s in A["sweep"])  # every gold label is SUPPORT
        assert right == round(row["label_accuracy"] * row["n_claims"])
    assert [row["label_accuracy"] for row in sweep["per_k"]] == [4 / 6, 4 / 6, 1.0, 1.0, 1.0]
    ra, rb = index["runs"]
    assert ra["arms"] == {"control": True, "gold_only": True, "cited_only": True, "size_sweep": True}
    assert rb["arms"] == {"control": True, "gold_only": True, "cited_only": False, "size_sweep": False}
    assert ra["metrics"]["cited_only"] == cited and ra["metrics"]["size_sweep"] == sweep
    assert rb["metrics"]["cited_only"] is None and rb["metrics"]["size_sweep"] is None
    details = [d for shard in shards for d in shard]
    for d, c in zip(details, claims):
        assert d["cited_only"] == [c["cited_only"], None] and d["size_sweep"] == [c["size_sweep"], None]
    assert details[0]["size_sweep"][0]["order"] and details[6]["size_sweep"][0] == {
        "skipped": "the pool holds only gold sentences"}


def test_a_metrics_json_written_before_the_arms_gets_them_from_fae_ablation_sufficiency(runs):
    tmp, m, claims = runs
    old = {k: v for k, v in m.items() if k not in ("cited_only", "size_sweep")}
    assert arm_metrics(old, claims) == {**old, "cited_only": m["cited_only"], "size_sweep": m["size_sweep"]}
    [run] = load_view_runs([tmp / "suff"])
    run.metrics = old
    assert run_entry(run)["metrics"]["size_sweep"]["per_k"] == m["size_sweep"]["per_k"]


def pct(x):
    return f"{100 * x:.2f}"


def test_the_page_shows_the_sufficiency_arms_in_the_table_filters_chips_and_claim_page(runs, tmp_path):
    tmp, m, claims = runs
    site = tmp_path / "site"
    assert fae(["view", str(tmp / "suff"), str(tmp / "plain"), "--output", str(site),
                "--names", "suff", "plain"]) == 0
    cited, sweep = m["cited_only"], m["size_sweep"]
    lst, cnei, snei, k0, c00, c02, only = render(site, [
        "#run=0&r=1", "#run=0&r=1&flags=cited_nei", "#run=0&r=1&flags=sweep_nei", "#run=0&r=0&pool=k0&ans=N",
        "#claim=c00&run=0&r=1", "#claim=c02&run=0&r=1", "#claim=only&run=0&r=1"], tmp_path)
    head = lst["head"]
    cols = [head.index(h) for h in ("cited-only Acc", "cited-only NEI", "sweep lowest Acc",
                                    "sweep Acc by k (k = 0 / 1 / \u2026)")]
    assert head.index("IS") == 7 and cols[0] == head.index("gold-only NEI") + 1
    row_a, row_b = lst["runs"]
    assert [row_a["cells"][c] for c in cols] == [
        pct(cited["label_accuracy"]), pct(cited["nei_answer_rate"]), pct(sweep["min_accuracy"]),
        " / ".join(pct(row["label_accuracy"]) for row in sweep["per_k"])]
    assert [row_b["cells"][c] for c in cols] == ["n/a"] * 4
    assert "--no-cited-only" in row_b["titles"][cols[0]] and "--no-size-sweep" in row_b["titles"][cols[2]]
    # every number is a link to the claims behind it, counted as metrics.json counts them
    links = dict(row_a["links"])
    assert links["#run=0&r=0&pool=cited&ans=correct"] == round(cited["label_accuracy"] * cited["n_claims"]) == 3
    assert links["#run=0&r=0&flags=cited_nei"] == 2
    for row in sweep["per_k"]:
        assert links[f"#run=0&r=0&pool=k{row['k']}&ans=correct"] == round(row["label_accuracy"] * row["n_claims"])
    ks = [h for h, _ in row_a["links"] if "pool=k" in h]
    assert ks[0] == "#run=0&r=0&pool=k0&ans=correct" and len(ks) == 1 + len(sweep["per_k"])  # lowest, then by k
    assert not any("pool=cited" in h or "pool=k" in h or "cited_nei" in h for h, _ in row_b["links"])
    right_k2 = render(site, ["#run=0&r=0&pool=k2&ans=correct"], tmp_path)[0]["select"]
    assert right_k2 == [c["id"] for c in claims if "rounds" in c["size_sweep"]
                        and round_label(c["size_sweep"]["rounds"][2]) == "SUPPORT"]
    # the filters: abstained on cited-only; abstained somewhere in the size sweep; NEI on the sweep's pool k = 0
    assert {"cited_nei", "sweep_nei"} <= set(lst["flags"])
    assert cnei["listed"] == cnei["select"] == [c["id"] for c in claims if code(c.get("cited_only")) == "N"] \
        == ["c00", "c03"]
    assert snei["listed"] == ["c00", "c03"] and k0["listed"] == ["c00", "c03"]
    assert lst["pools"] == ["", "gold", "cited", "k0", "k1", "k2", "k3", "k4"]
    assert render(site, ["#run=1&r=1&flags=cited_nei"], tmp_path)[0]["select"] == []  # plain has none
    # chips: cited-only after the control and gold-only chips, then one chip per sweep pool k
    chips = lst["chips"]["c00"][0]
    assert [c for c in chips if "cited-only" in c] == ["chip cited-only c-N:N"]
    assert "".join(c[-1] for c in chips if " sweep " in c + " ") == "NNSSS"
    assert [c for c in lst["chips"]["c02"][0] if "cited-only" in c] == ["chip cited-only c-left:-"]
    assert not any("cited-only" in c or "sweep" in c for c in lst["chips"]["c00"][1])
    # the claim page: the cited-only pool and every sweep pool, lines not in the pool struck through
    c = claims[0]
    full = c["rounds"][0]["pool_ids"]
    panels = {(a["arm"], a["k"]): a for a in c00["arms"] if a["arm"]}
    assert set(panels) == {("cited-only", None), *(("sweep", k) for k in range(5))}
    assert all(a["run"] == 0 for a in panels.values())  # run "plain" asked neither
    co = panels["cited-only", None]
    assert co["label"] == "NOT_ENOUGH_INFO" and co["shown"] == full
    assert co["struck"] == [i for i in full if i not in c["cited_only"]["pool_ids"]] and len(co["struck"]) == 5
    order = c["size_sweep"]["order"]
    for k, rd in enumerate(c["size_sweep"]["rounds"]):
        a = panels["sweep", k]
        assert a["label"] == rd["label"] == ("NOT_ENOUGH_INFO" if k < 2 else "SUPPORT")
        assert a["struck"] == [i for i in full if i not in rd["pool_ids"]] and len(a["struck"]) == 5 - k
        assert a["cited"] == rd["cited"]
        assert f"size sweep k = {k}" in a["text"] and f"added{json.dumps(order[:k]) if k else 'none'}" in a["text"]
    # the control panel says whether the control was matched on the gap the ablation left
    ctrl = [a for a in c00["arms"] if "control" in a["cls"] and a["run"] == 0]
    assert len(ctrl) == 2
    for a, rd in zip(ctrl, c["control"]):
        want = {"kind": "yes: the same kind of gap", "shown": "yes: a gap the prompt shows",
                None: "no: no draw could leave"}[rd["gap_matched"]]
        gaps = [", ".join(removal_gap(full, pool)) or "no gap"
                for pool in (rd["pool_ids"], c["rounds"][rd["round"]]["pool_ids"])]
        assert "gap matched" + want in a["text"] and f"(control: {gaps[0]}; ablation: {gaps[1]})" in a["text"]
    assert {rd["gap_matched"] for c in claims for rd in c["control"] if "skipped" not in rd} >= {"kind", "shown"}
    # left out: c02's cited-only pool (round 0 cited nothing), the sweep of a pool of gold lines only
    lo = {a["arm"]: a for a in c02["arms"] if a["arm"]}
    assert lo["cited-only"]["label"] == "left out" and "round 0 cited no line of the pool" in lo["cited-only"]["text"]
    assert [a["k"] for a in c02["arms"] if a["arm"] == "sweep"] == [0, 1, 2, 3, 4]
    sw = [a for a in only["arms"] if a["arm"] == "sweep"]
    assert len(sw) == 1 and sw[0]["label"] == "left out" and "only gold sentences" in sw[0]["text"]


SWEEP_PANELS = """(() => [...document.querySelectorAll('.arm[data-run="0"][data-arm]')].map(div => {
  const lis = [...div.querySelectorAll('ol.pool li')];
  const struck = lis.filter(li => { const s = li.querySelector('s');
    return s && getComputedStyle(s).textDecorationLine.includes('line-through'); });
  const label = div.querySelector('.arm-label');
  return {arm: div.dataset.arm, k: div.dataset.k === undefined ? null : +div.dataset.k,
          label: label ? label.textContent : null, shown: lis.map(li => +li.dataset.sid),
          struck: struck.map(li => +li.dataset.sid), visible: div.getBoundingClientRect().height > 0};
}))()"""


@pytest.mark.slow
def test_a_claim_page_in_chromium_shows_each_sweep_pool_with_the_lines_not_in_it_struck(runs, tmp_path, chromium,
                                                                                        screens):
    from fae.view.browser import Chromium

    tmp, _, claims = runs
    site = tmp_path / "site"
    assert fae(["view", str(tmp / "suff"), str(tmp / "plain"), "--output", str(site), "--names", "suff", "plain"]) == 0
    c = claims[0]
    full = c["rounds"][0]["pool_ids"]
    with Chromium(chromium, width=1400, height=1000) as b:
        b.open((site / "index.html").as_uri())
        b.wait_for("document.body.dataset.state === 'ready'")
        hash_ = "#claim=c00&run=0&r=1"
        b.evaluate(f"location.hash = {json.dumps(hash_)}")
        b.wait_for(f"document.body.dataset.state === 'ready' && document.body.dataset.route === {json.dumps(hash_)}")
        panels = b.evaluate(SWEEP_PANELS)
        b.screenshot(screens / "claim-sufficiency.png")
        assert b.page_errors() == []
    sweep = [p for p in panels if p["arm"] == "sweep"]
    assert [p["k"] for p in sweep] == [rd["k"] for rd in c["size_sweep"]["rounds"]] == [0, 1, 2, 3, 4]
    for p, rd in zip(sweep, c["size_sweep"]["rounds"]):
        assert p["visible"] and p["shown"] == full and p["label"] == rd["label"]
        assert p["struck"] == [i for i in full if i not in rd["pool_ids"]]
    [cited] = [p for p in panels if p["arm"] == "cited-only"]
    assert cited["struck"] == [i for i in full if i not in c["cited_only"]["pool_ids"]]
    assert cited["label"] == c["cited_only"]["label"] == "NOT_ENOUGH_INFO"
