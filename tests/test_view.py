"""`fae view`: the index's per-claim summaries against the metrics, alignment of runs by claim id,
the site on disk, bad input, and figures where no series hides another.

The browser half (headless Chromium over the viewer) is tests/test_view_browser.py; the control arm and
gold-only pools are also driven here through view.js itself under node with a minimal DOM (skipped
without node).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from real_fae_core.hashing import sha256_file
from data_prep.records import save_records
from fae.ablation.metrics import compute_metrics
from fae.cli import main as fae
from fae.view.data import answer_summary, arm_metrics, build_view, load_view_runs
from fae.view.site import MARKER
from fae_helpers import seal_run
from view_helpers import render


def rnd(r, pool, label, cited=(), halluc=(), *, valid=True, truncated=False, reused=False, probs=None):
    out = {"round": r, "pool_ids": list(pool), "raw_output": f"answer {r}", "label": label if valid else None,
           "cited": list(cited), "hallucinated": list(halluc), "valid": valid, "reused": reused,
           "evidence": list(cited) + list(halluc), "error": None if valid else "no label", "truncated": truncated}
    if probs is not None:
        out["label_probs"] = probs
    return out


def P(s, r, n):
    return {"SUPPORT": s, "REFUTE": r, "NOT_ENOUGH_INFO": n}


def record(cid, label, n=4, gold=((0,),), dataset="toy"):
    return {"id": cid, "dataset": dataset, "claim": f"claim {cid} about apples", "label": label,
            "sentences": [{"id": i, "text": f"{cid} line {i}", "doc": "d"} for i in range(n)],
            "evidence": [list(g) for g in gold]}


# c1: grounded (SUPPORT, then NEI once line 0 is gone); c2: keeps REFUTE, flips to SUPPORT at r2;
# c3: invalid and cut off at round 1, hallucinated id at round 0; c4: wrong at round 0.
CLAIMS_A = [
    {"id": "c1", "gold_label": "SUPPORT", "gold_groups": [[0]], "rounds": [
        rnd(0, [0, 1, 2, 3], "SUPPORT", [0], probs=P(.9, .05, .05)),
        rnd(1, [1, 2, 3], "NOT_ENOUGH_INFO", probs=P(.2, .1, .7)),
        rnd(2, [1, 2, 3], "NOT_ENOUGH_INFO", reused=True, probs=P(.2, .1, .7))]},
    {"id": "c2", "gold_label": "REFUTE", "gold_groups": [[1]], "rounds": [
        rnd(0, [0, 1, 2, 3], "REFUTE", [1, 2], probs=P(.1, .8, .1)),
        rnd(1, [0, 3], "REFUTE", [3], probs=P(.2, .7, .1)),
        rnd(2, [0], "SUPPORT", [0], probs=P(.6, .3, .1))]},
    {"id": "c3", "gold_label": "SUPPORT", "gold_groups": [[2]], "rounds": [
        rnd(0, [0, 1, 2, 3], "SUPPORT", [3], [9], probs=P(.6, .2, .2)),
        rnd(1, [0, 1, 2], None, valid=False, truncated=True),
        rnd(2, [0, 1, 2], None, valid=False, truncated=True, reused=True)]},
    {"id": "c4", "gold_label": "REFUTE", "gold_groups": [[0]], "rounds": [
        rnd(0, [0, 1, 2, 3], "SUPPORT", [], probs=P(.7, .2, .1)),
        rnd(1, [0, 1, 2, 3], "SUPPORT", reused=True, probs=P(.7, .2, .1)),
        rnd(2, [0, 1, 2, 3], "SUPPORT", reused=True, probs=P(.7, .2, .1))]},
]


def make_run(tmp: Path, name: str, claims: list[dict], records_path: Path) -> Path:
    run = tmp / name
    run.mkdir()
    (run / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))
    (run / "config.json").write_text(json.dumps({"records": str(records_path), "backend": "hf", "model": "toy",
                                                 "records_sha256": sha256_file(records_path), "rounds": 2}))
    n_nei = sum(1 for line in records_path.read_text().splitlines() if '"NOT_ENOUGH_INFO"' in line)
    return seal_run(run, metrics=compute_metrics(claims, n_excluded_nei=n_nei))


@pytest.fixture
def toy_runs(tmp_path):
    recs = [record(c["id"], c["gold_label"], gold=c["gold_groups"]) for c in CLAIMS_A]
    recs += [record("c5", "SUPPORT"), record("n1", "NOT_ENOUGH_INFO", gold=(), dataset="other")]
    records = tmp_path / "records.jsonl"
    save_records(recs, records)
    # run b: the same verifier on c2, c1 (another order) and c5, which run a does not have
    claims_b = [CLAIMS_A[1], CLAIMS_A[0],
                {"id": "c5", "gold_label": "SUPPORT", "gold_groups": [[0]], "rounds": [
                    rnd(0, [0, 1, 2, 3], "SUPPORT", [0]), rnd(1, [1, 2, 3], "SUPPORT", [1]),
                    rnd(2, [2, 3], "REFUTE", [2])]}]
    return make_run(tmp_path, "a", CLAIMS_A, records), make_run(tmp_path, "b", claims_b, records), records


def test_answer_summary_bits_are_the_metrics_per_claim():
    s = [answer_summary(c) for c in CLAIMS_A]
    assert [x["labels"] for x in s] == ["SNN", "RRS", "Sxx", "SSS"]
    m = compute_metrics(CLAIMS_A)
    n = m["n_claims"]
    # a second measure of the same thing: bit r of `correct` summed over claims is a_r
    for r, a in enumerate(m["round_accuracy"]):
        assert sum(x["correct"] >> r & 1 for x in s) == round(a * n)
        assert sum(x["invalid"] >> r & 1 for x in s) == round(m["invalid_rate"][r] * n)
        assert sum(x["truncated"] >> r & 1 for x in s) == round(m["truncated_rate"][r] * n)
    assert sum(x["flipped"] for x in s) == round(m["any_flip_rate"] * n) == 1
    assert sum(x["strict"] for x in s) == round(m["strict_accuracy"] * n) == 2  # c3 cites a non-gold line
    assert [x["hallucinated"] for x in s] == [0, 0, 1, 0] and s[3]["reused"] == 0b110
    assert s[0]["p_gold"] == [0.9, 0.2, 0.2] and s[1]["p_gold"] == [0.8, 0.7, 0.3]
    assert s[2]["p_gold"] == [0.6, None, None]


def test_runs_are_aligned_by_claim_id_and_nei_gold_records_are_listed_as_excluded(toy_runs):
    a, b, _ = toy_runs
    runs = load_view_runs([a, b], ["A", "B"])
    index, shards = build_view(runs, shard_size=2)
    ids = index["claims"]["id"]
    assert ids == ["c1", "c2", "c3", "c4", "c5", "n1"]  # run a's order, then b's extra, then NEI-gold
    assert index["claims"]["excluded"] == [0, 0, 0, 0, 0, 1]
    assert [index["labels"][g] for g in index["claims"]["gold"]] == \
        ["SUPPORT", "REFUTE", "SUPPORT", "REFUTE", "SUPPORT", "NOT_ENOUGH_INFO"]
    assert [index["datasets"][d] for d in index["claims"]["dataset"]] == ["toy"] * 5 + ["other"]
    A, B = index["answers"]
    assert A["labels"] == ["SNN", "RRS", "Sxx", "SSS", "", ""] and B["labels"] == ["SNN", "RRS", "", "", "SSR", ""]
    assert A["known"] == B["known"] == [1] * 6  # both runs read the records file that holds every id
    shards = list(shards)
    assert [len(s) for s in shards] == [2, 2, 2]
    c5 = shards[2][0]
    assert c5["id"] == "c5" and c5["runs"][0] is None and c5["runs"][1][2]["label"] == "REFUTE"
    assert c5["sentences"][1] == [1, "c5 line 1", "d"] and c5["claim"] == "claim c5 about apples"
    assert shards[2][1]["runs"] == [None, None] and shards[2][1]["gold_label"] == "NOT_ENOUGH_INFO"
    assert index["runs"][0]["metrics"]["n_excluded_nei"] == 1


def test_fae_view_writes_a_self_contained_site_and_replaces_only_a_viewer(toy_runs, tmp_path, capsys):
    a, b, _ = toy_runs
    out = tmp_path / "site"
    assert fae(["view", str(a), str(b), "--output", str(out), "--shard-size", "4"]) == 0
    assert "6 claims, 2 runs" in capsys.readouterr().out
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [MARKER, "assets/view.css", "assets/view.js", "data/claims/00000.js", "data/claims/00001.js",
                     "data/index.js", "index.html"]
    text = "".join((out / f).read_text() for f in files)
    for remote in ("http://", "https://", "//cdn", "fetch(", "XMLHttpRequest"):  # nothing leaves the file system
        assert remote not in text.replace("http://www.w3.org/2000/svg", "")
    index = (out / "data" / "index.js").read_text()
    assert index.startswith("FAE_VIEW.index({") and index.rstrip().endswith("});")
    assert json.loads(index[len("FAE_VIEW.index("):-3])["n_claims"] == 6
    # a second run replaces the viewer; a directory that is not one is refused, untouched
    (out / "data" / "claims" / "00001.js").unlink()
    assert fae(["view", str(a), "--output", str(out)]) == 0
    assert (out / "data" / "claims" / "00000.js").exists() and not (out / "data" / "claims" / "00001.js").exists()
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert fae(["view", str(a), "--output", str(other)]) == 2
    err = capsys.readouterr().err
    assert "not a `fae view` output" in err and len(err.strip().splitlines()) == 1
    assert (other / "notes.txt").read_text() == "keep" and sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_bad_input_is_one_line(toy_runs, tmp_path, capsys):
    a, b, records = toy_runs
    out = str(tmp_path / "site")
    assert fae(["view", str(a), str(b), "--output", out, "--names", "only-one"]) == 2
    assert "--names has 1 names for 2 runs" in capsys.readouterr().err
    changed = tmp_path / "changed.jsonl"
    changed.write_text(records.read_text().replace("about apples", "about pears"))
    assert fae(["view", str(a), "--output", out, "--records", str(changed)]) == 2
    err = capsys.readouterr().err
    assert "does not match records_sha256" in err and len(err.strip().splitlines()) == 1
    (a / "claims.jsonl").write_text((a / "claims.jsonl").read_text().splitlines(True)[0])  # unfinished run
    assert fae(["view", str(a), "--output", out]) == 2
    assert "unfinished run (3 of 4 claims missing" in capsys.readouterr().err
    assert not Path(out).exists()


# ---------------------------------------------------------------------------- figures that hide nothing


def _run(name, acc):
    return {"name": name, "metrics": {"round_accuracy": acc}}


def test_trajectory_shows_identical_runs_with_integer_ticks_and_the_legend_off_the_data(tmp_path):
    import matplotlib.colors as mcolors
    import numpy as np
    from matplotlib.image import imread

    from fae.ablation.report import plot_trajectories, trajectory_figure

    runs = [_run("sft", [0.9, 0.8, 0.8, 0.7, 0.7]), _run("no_ablation", [0.9, 0.8, 0.8, 0.7, 0.7]),
            _run("no_enhancement", [0.9, 0.6, 0.5, 0.5, 0.5]), _run("real", [0.9, 0.1, 0.05, 0.0, 0.0])]
    fig = trajectory_figure(runs)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2, 3, 4]
    fig.canvas.draw()
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= frame.x1  # right of the axes: never over a line
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert len({lines[n].get_marker() for n in ("sft", "no_ablation", "no_enhancement", "real")}) == 4
    assert lines["sft"].get_xdata()[0] != lines["no_ablation"].get_xdata()[0]  # shifted apart
    import matplotlib.pyplot as plt

    plt.close(fig)
    png = imread(plot_trajectories(runs, tmp_path / "t.png"))[..., :3]
    # every run's colour is on the image, sft's too although no_ablation has the same values
    for color in ("C0", "C1", "C2", "C3"):
        rgb = np.array(mcolors.to_rgb(color))
        assert (np.abs(png - rgb).max(axis=-1) < 0.02).sum() > 40, color


def test_soft_figures_have_integer_round_ticks_and_legends_off_the_data():
    import matplotlib.pyplot as plt

    from fae.ablation.report import reliability_figure, soft_trajectory_figure
    from fae.ablation.soft_metrics import soft_metrics

    runs = [{"name": n, "claims": CLAIMS_A, "metrics": {"soft": soft_metrics(CLAIMS_A)}} for n in ("sft", "real")]
    fig = soft_trajectory_figure(runs)
    fig.canvas.draw()
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [0, 1, 2]  # rounds, never 0.5, 1.5, ...
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    legend = fig.axes[1].get_legend().get_window_extent()
    assert legend.x0 >= fig.axes[1].get_window_extent().x1
    xs = [ln.get_xdata()[0] for ln in fig.axes[0].get_lines()]
    assert len(xs) == 2 and xs[0] != xs[1]  # equal curves, drawn apart
    plt.close(fig)
    fig = reliability_figure(runs)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1
    plt.close(fig)


def test_fae_view_as_a_function_writes_what_the_command_line_writes(toy_runs, tmp_path, capsys):
    from fae.view.runner import ViewConfig, run
    from real_fae_core.errors import UserError

    a, b, records = toy_runs
    assert fae(["view", str(a), str(b), "--output", str(tmp_path / "cli"), "--names", "A", "B",
                "--records", str(records), "--shard-size", "4"]) == 0
    res = run(ViewConfig(runs=[str(a), str(b)], output=tmp_path / "py", names=["A", "B"], records=records, shard_size=4))
    assert res.ok and res.outputs == {"page": str(tmp_path / "py" / "index.html"), "site": str(tmp_path / "py")}
    assert res.summary == {"n_claims": 6, "n_runs": 2}

    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(tmp_path / "py") == files(tmp_path / "cli")
    with pytest.raises(UserError, match=r"^ViewConfig: shard_size: must be >= 1, got 0$"):
        ViewConfig(runs=[str(a)], output=tmp_path / "x", shard_size=0)
    with pytest.raises(UserError, match=r"^--names has 1 names for 2 runs$"):
        run(ViewConfig(runs=[str(a), str(b)], output=tmp_path / "x", names=["A"]))


# ---------------------------------------------------------------------------- the control arm and gold-only pools


def with_arms(claims):
    """CLAIMS_A with a control arm (rounds 1..2) and gold-only pools, as `fae run` writes them (SPEC §6).

    Control at round 1: c1 keeps SUPPORT, c2 abstains, c3 answers REFUTE (wrong), c4 (nothing removed by the
    ablation) copies round 0. c2 is left out at round 2 (one free line, three to remove). Gold-only: c1 SUPPORT,
    c2 and c3 abstain, c4 REFUTE.
    """
    out = copy.deepcopy(claims)
    c1, c2, c3, c4 = out

    def ctrl(r, pool, label, cited=(), removed=(), reused=False):
        return {**rnd(r, pool, label, cited, reused=reused), "raw_output": f"control {r}", "removed": list(removed)}

    c1["control"] = [ctrl(1, [0, 1, 2], "SUPPORT", [0], [3]), ctrl(2, [0, 1, 2], "SUPPORT", [0], [3], reused=True)]
    c2["control"] = [ctrl(1, [1, 2], "NOT_ENOUGH_INFO", removed=[0, 3]),
                     {"round": 2, "skipped": "1 lines neither cited nor gold; the ablation removed 3 by round 2",
                      "removed_needed": 3}]
    c3["control"] = [ctrl(1, [0, 2, 3], "REFUTE", [3], [1]), ctrl(2, [0, 2, 3], "REFUTE", [3], [1], reused=True)]
    c4["control"] = [{**c4["rounds"][0], "round": r, "reused": True, "removed": []} for r in (1, 2)]
    for c, pool, label, cited in ((c1, [0], "SUPPORT", [0]), (c2, [1], "NOT_ENOUGH_INFO", []),
                                  (c3, [2], "NOT_ENOUGH_INFO", []), (c4, [0], "REFUTE", [0])):
        c["gold_only"] = {**rnd(0, pool, label, cited), "raw_output": "gold-only answer"}
    return out


def copies(claims, n):
    """``n`` copies of ``claims``, ids ``c1``, ..., then ``c1.1``, ...: enough claims for a bootstrap interval."""
    return [{**copy.deepcopy(c), "id": c["id"] + (f".{k}" if k else "")} for k in range(n) for c in claims]


@pytest.fixture
def arm_runs(tmp_path):
    """Run "arms" asked the control and gold-only pools; run "plain" (--control none --no-gold-only) did not.
    Three copies of the four claims: 12 claims, enough for the control's bootstrap intervals."""
    claims = copies(with_arms(CLAIMS_A), 3)
    records = tmp_path / "records.jsonl"
    save_records([record(c["id"], c["gold_label"], gold=c["gold_groups"]) for c in claims], records)
    arms = make_run(tmp_path, "arms", claims, records)
    cfg = json.loads((arms / "config.json").read_text())
    (arms / "config.json").write_text(json.dumps({**cfg, "control": "random", "control_seed": 0, "gold_only": True,
                                                  "line_ids": "original"}))
    return arms, make_run(tmp_path, "plain", copies(CLAIMS_A, 3), records), claims


def test_the_index_holds_the_control_and_gold_only_answers_the_metrics_count(arm_runs):
    arms, plain, claims = arm_runs
    s = [answer_summary(c) for c in claims]
    assert [x["ctrl"] for x in s] == [".SS", ".N-", ".RR", ".SS"] * 3
    assert [x["gold_only"] for x in s] == ["S", "N", "N", "R"] * 3
    assert [answer_summary(c)["ctrl"] + answer_summary(c)["gold_only"] for c in CLAIMS_A] == [""] * 4
    m = compute_metrics(claims)
    ctrl, gold = m["control"], m["gold_only"]
    # a second measure of the metrics' counts: the codes the filters read
    assert sum(x["ctrl"][1] == "N" for x in s) == round(ctrl["nei_answer_rate_ctrl"][0]
                                                        * (m["n_claims"] - ctrl["n_left_out"][0])) == 3
    assert sum(x["ctrl"][2] == "-" for x in s) == ctrl["n_left_out"][1] == 3
    assert sum(x["gold_only"] == "N" for x in s) == round(gold["nei_answer_rate"] * gold["n_claims"]) == 6
    runs = load_view_runs([arms, plain], ["arms", "plain"])
    index, shards = build_view(runs)
    A, B = index["answers"]
    assert A["ctrl"] == [".SS", ".N-", ".RR", ".SS"] * 3 and A["gold_only"] == ["S", "N", "N", "R"] * 3
    assert B["ctrl"] == B["gold_only"] == [""] * 12
    ra, rb = index["runs"]
    assert ra["arms"] == {"control": True, "gold_only": True, "cited_only": False, "size_sweep": False}
    assert rb["arms"] == dict.fromkeys(("control", "gold_only", "cited_only", "size_sweep"), False)
    assert ra["metrics"]["control"] == json.loads((arms / "metrics.json").read_text())["control"] == ctrl
    assert rb["metrics"]["control"] is None and rb["metrics"]["gold_only"] is None
    c2 = list(shards)[0][1]
    assert c2["control"][0] == claims[1]["control"] and c2["gold_only"][0] == claims[1]["gold_only"]
    assert c2["control"][1] is None and c2["gold_only"][1] is None
    # a metrics.json written before the arms existed: fae.ablation.control computes them, never the viewer
    old = {k: v for k, v in m.items() if k not in ("control", "gold_only")}
    assert arm_metrics(old, claims) == {**old, "control": ctrl, "gold_only": gold}
    assert arm_metrics(old, CLAIMS_A) == {**old, "control": None, "gold_only": None}
    assert ctrl["intervals"]["IS_minus_IS_ctrl"]["ci_low"] is not None  # 12 claims: the page shows an interval


def test_the_page_shows_the_control_beside_the_rounds_and_filters_on_abstentions(arm_runs, tmp_path):
    arms, plain, claims = arm_runs
    site = tmp_path / "site"
    assert fae(["view", str(arms), str(plain), "--output", str(site), "--names", "arms", "plain"]) == 0
    m = json.loads((arms / "metrics.json").read_text())
    ctrl, gold = m["control"], m["gold_only"]
    lst, nei1, gnei, c2, c1 = render(site, ["#run=0&r=1", "#run=0&r=1&flags=ctrl_nei1", "#run=0&r=0&flags=gold_nei",
                                            "#claim=c2&run=0&r=1", "#claim=c1&run=0&r=1"], tmp_path)
    # run table: IS_ctrl and IS - IS_ctrl with their intervals, gold-only Acc and NEI share; n/a without them
    head = lst["head"]
    cols = [head.index(h) for h in ("IS_ctrl [95%]", "IS \u2212 IS_ctrl [95%]", "NEI on control r1",
                                    "gold-only Acc", "gold-only NEI")]
    assert head.index("IS") == 7  # the columns before IS stay where they were

    def p(x):
        return f"{100 * x:.2f}"

    def iv(key):
        i = ctrl["intervals"][key]
        return f"{p(ctrl[key])} [{p(i['ci_low'])}, {p(i['ci_high'])}]"

    row_a, row_b = lst["runs"]
    assert [row_a["cells"][c] for c in cols] == [iv("IS_ctrl"), iv("IS_minus_IS_ctrl"),
                                                 p(ctrl["nei_answer_rate_ctrl"][0]), p(gold["label_accuracy"]),
                                                 p(gold["nei_answer_rate"])]
    assert [row_b["cells"][c] for c in cols] == ["n/a"] * 5
    assert "--control none" in row_b["titles"][cols[0]] and "--no-gold-only" in row_b["titles"][cols[3]]
    links = dict(row_a["links"])
    assert links["#run=0&r=1&flags=ctrl_nei1"] == 3 and links["#run=0&r=0&flags=gold_nei"] == 6
    assert not any("ctrl_nei1" in h or "gold_nei" in h for h, _ in row_b["links"])
    # the claim list filters on abstaining on the control at round 1 / on gold-only
    assert {"ctrl_nei1", "gold_nei"} <= set(lst["flags"])
    assert nei1["listed"] == nei1["select"] == ["c2", "c2.1", "c2.2"]
    assert gnei["listed"] == ["c2", "c3", "c2.1", "c3.1", "c2.2", "c3.2"]
    assert render(site, ["#run=1&r=1&flags=ctrl_nei1"], tmp_path)[0]["select"] == []  # plain has no control
    # the claim page: both runs' rounds, and beside run "arms" its gold-only answer (round 0) and control pools
    assert len(c2["rounds"]) == 2 * 3
    by = {(a["run"], a["round"]): a for a in c2["arms"]}
    assert set(by) == {(0, 0), (0, 1), (0, 2)}  # run "plain" has no column for them
    assert by[0, 0]["label"] == "NOT_ENOUGH_INFO" and by[0, 0]["struck"] == [0, 2, 3] and "gold-only" in by[0, 0]["cls"]
    assert by[0, 1]["label"] == "NOT_ENOUGH_INFO" and by[0, 1]["struck"] == [0, 3]
    assert "control removed[0, 3]" in by[0, 1]["text"] and by[0, 1]["shown"] == [0, 1, 2, 3]
    assert by[0, 2]["label"] == "left out" and \
        "left out: 1 lines neither cited nor gold; the ablation removed 3 by round 2" in by[0, 2]["text"]
    by1 = {(a["run"], a["round"]): a for a in c1["arms"]}
    assert by1[0, 1]["cited"] == [0] and by1[0, 1]["struck"] == [3] and "reused" not in by1[0, 1]["text"]
    assert "reused" in by1[0, 2]["text"] and by1[0, 0]["label"] == "SUPPORT"


def test_a_site_of_runs_without_the_arms_shows_no_arm_column_and_no_arm_filter(toy_runs, tmp_path):
    a, b, _ = toy_runs
    site = tmp_path / "site"
    assert fae(["view", str(a), str(b), "--output", str(site)]) == 0
    lst, page = render(site, ["#run=0&r=1", "#claim=c1&run=0&r=1"], tmp_path)
    head = lst["head"]
    for row in lst["runs"]:
        assert row["cells"][head.index("IS_ctrl [95%]")] == "n/a"
        assert row["cells"][head.index("gold-only NEI")] == "n/a"
    assert not {"ctrl_nei1", "gold_nei"} & set(lst["flags"])
    assert len(page["rounds"]) == 2 * 3 and page["arms"] == []
