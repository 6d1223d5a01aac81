"""`fae view`: the index's per-claim summaries against the metrics, alignment of runs by claim id,
the site on disk, bad input, and figures where no series hides another.

The browser half (headless Chromium over the viewer) is tests/test_view_browser.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_fae_core.hashing import sha256_file
from data_prep.records import save_records
from fae.ablation.metrics import compute_metrics
from fae.cli import main as fae
from fae.view.data import answer_summary, build_view, load_view_runs
from fae.view.site import MARKER
from fae_helpers import seal_run


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
    from fae.view.cli import ViewConfig, run
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
