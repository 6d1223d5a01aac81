"""One JSON and one Markdown table for a reproduce.sh experiment: Table-1 columns, soft FAE, DirK, PAVE, timings.

    python recipes/summarize.py --model-id smollm2-135m-instruct --systems base sft no_enhancement \
        --sets check-covid-test scifact-dev --output reports/smollm2-135m-instruct/summary.json

It reads only what the steps wrote under the path scheme (recipes/README.md): runs/<model>/<system>/<set>
(metrics.json with the control arm and gold-only pools; claims.jsonl for the 95% bootstrap intervals of Acc, Strict,
IS, ER, IO, Acc against chance, and each system's paired differences from --baseline), probes/...
(dirk.json), pave/... (pave.json, with its own intervals), reports/<model>/<set>/dirk/dirk_common.json (DirK
on one common claim subset), reports/<model>/checkpoints-* and the step times; a missing piece is recorded as
missing, never invented.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_fae_core.atomicio import atomic_write_text  # noqa: E402
from fae.comparison.checks import load_compared  # noqa: E402
from fae.comparison.compare import compare_runs  # noqa: E402
from fae.ablation.metrics import MIN_INTERVAL_UNITS, chance_comparison, metric_intervals  # noqa: E402
from fae.ablation.soft_metrics import has_probs, label_token_answers  # noqa: E402

TABLE1 = (("Prec", "evidence_precision"), ("Rec", "evidence_recall"), ("F1", "evidence_f1"),
          ("Acc", "label_accuracy"), ("Strict", "strict_accuracy"), ("IS", "IS"), ("ER", "ER"), ("IO", "IO"))


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _pct(x) -> float | None:
    return None if x is None else round(100 * x, 2)


def fae_row(metrics: dict) -> dict:
    row = {name: _pct(metrics.get(key)) for name, key in TABLE1}
    row.update(n_claims=metrics.get("n_claims"),
               round_accuracy=[_pct(a) for a in metrics.get("round_accuracy") or []],
               nei_answer_rate=[_pct(a) for a in metrics.get("nei_answer_rate") or []],
               invalid_rate=[_pct(a) for a in metrics.get("invalid_rate") or []],
               reasons={k: metrics[k] for k in ("IS_reason", "ER_reason", "IO_reason") if metrics.get(k)})
    row["control"] = metrics.get("control")  # IS_ctrl, IS - IS_ctrl with intervals (fae.ablation.control)
    row["gold_only"] = metrics.get("gold_only")
    row["cited_only"] = metrics.get("cited_only")  # sufficiency: the claim on the lines it cited at round 0 alone
    row["size_sweep"] = metrics.get("size_sweep")  # sufficiency: gold plus k other lines, per k
    soft = metrics.get("soft") or {}
    row["soft"] = {k: soft.get(k) for k in ("soft_IS", "nei_area", "p_gold", "p_nei", "ece") if k in soft}
    return row


def dirk_row(dirk: dict) -> list[dict]:
    return [{k: r.get(k) for k in ("round", "mean", "ci_low", "ci_high", "n", "n_undefined")}
            for r in dirk.get("rounds", [])]


def _claims(path: Path) -> list[dict] | None:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return None


def step_times(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def summarize(root: Path, model_id: str, systems: list[str], sets: list[str], baseline: str | None = None) -> dict:
    """The summary; with ``baseline`` (a system), every other system's paired differences from it per set."""
    out: dict = {"model_id": model_id, "systems": systems, "sets": {}, "missing": [], "baseline": baseline}
    for s in sets:
        per = {}
        for system in systems:
            entry = {}
            metrics = _load(root / "runs" / model_id / system / s / "metrics.json")
            if metrics is None:
                out["missing"].append(f"runs/{model_id}/{system}/{s}/metrics.json")
            else:
                entry["fae"] = fae_row(metrics)
                run_config = _load(root / "runs" / model_id / system / s / "config.json") or {}
                entry["fae"]["dtype"] = (run_config.get("decoding") or {}).get("dtype")  # the dtype it ran in
                claims = _claims(root / "runs" / model_id / system / s / "claims.jsonl")
                if claims is not None:
                    entry["fae"]["intervals"] = {k: ({"ci_low": _pct(v["ci_low"]), "ci_high": _pct(v["ci_high"]),
                                                      "defined": v["defined"]} if isinstance(v, dict) else v)
                                                 for k, v in metric_intervals(claims).items()}
                    entry["fae"]["chance"] = chance_comparison(claims)
                    if has_probs(claims):  # the same claims scored by their label tokens, not the generated text
                        entry["fae"]["chance_label_token"] = chance_comparison(label_token_answers(claims))
            dirk = _load(root / "probes" / model_id / system / s / "dirk.json")
            if dirk is not None:
                entry["dirk"] = dirk_row(dirk)
                for key in ("knowledge_reference", "knowledge_answers", "abstaining_reference", "invalid_reference",
                            "reference_note"):
                    if key in dirk:
                        entry[f"dirk_{key}"] = dirk[key]
            pave = _load(root / "pave" / model_id / system / s / "pave.json")
            if pave is not None:
                entry["pave"] = pave
            per[system] = entry
        out["sets"][s] = per
        base_run = root / "runs" / model_id / str(baseline) / s
        if baseline and (base_run / "metrics.json").is_file():
            diffs = {}
            for system in systems:
                other = root / "runs" / model_id / system / s
                if system != baseline and (other / "metrics.json").is_file():
                    diffs[system] = system_differences(base_run, other)
            out.setdefault("differences", {})[s] = diffs
        common = _load(root / "reports" / model_id / s / "dirk" / "dirk_common.json")
        if common is not None:
            out.setdefault("dirk_common", {})[s] = common
    checkpoints = {}
    for d in sorted((root / "reports" / model_id).glob("checkpoints-*")):
        table = _load(d / "checkpoints.json")
        if table is not None:
            checkpoints[d.name] = table
    out["checkpoints"] = checkpoints
    times = step_times(root / "reports" / model_id / "step_times.jsonl")
    out["step_times"] = times
    out["wall_seconds_total"] = sum(t["seconds"] for t in times)
    return out


DIFFERENCES = ("label_accuracy", "IS", "IS_minus_IS_ctrl", "gold_only_accuracy", "cited_only_accuracy",
               "sweep_accuracy")
DIFFERENCE_HEADINGS = ("Acc", "IS", "IS − IS_ctrl", "gold-only Acc", "cited-only Acc", "size-sweep Acc (mean over k)")


def system_differences(run_a: Path, run_b: Path, n_resamples: int = 2000, seed: int = 0) -> dict:
    """B − A on Acc, IS, IS − IS_ctrl, gold-only, cited-only and size-sweep accuracy (x100), paired: `fae
    compare`'s one bootstrap over the claims of both runs, the same draws for every metric (compare.json's
    ``metrics``, ``control``, ``gold_only``, ``cited_only`` and ``size_sweep`` blocks)."""
    res = compare_runs(load_compared(run_a), load_compared(run_b), metric="label_accuracy",
                       n_resamples=n_resamples, seed=seed)
    control, gold = res.get("control") or {}, res.get("gold_only") or {}
    cited, sweep = res.get("cited_only") or {}, res.get("size_sweep") or {}
    found = {"label_accuracy": ((res["metrics"].get("label_accuracy") or {}).get("difference"), res["n_claims"]),
             "IS": ((res["metrics"].get("IS") or {}).get("difference"), res["n_claims"]),
             "IS_minus_IS_ctrl": ((control.get("IS_minus_IS_ctrl") or {}).get("difference"), control.get("n_claims")),
             "gold_only_accuracy": ((gold.get("label_accuracy") or {}).get("difference"), gold.get("n_claims")),
             "cited_only_accuracy": ((cited.get("label_accuracy") or {}).get("difference"), cited.get("n_claims")),
             "sweep_accuracy": ((sweep.get("sweep_accuracy") or {}).get("difference"), sweep.get("n_claims"))}
    out = {"method": f"fae compare: paired bootstrap over claims ({n_resamples} draws, seed {seed})",
           "n_claims": res["n_claims"]}
    for key, (d, n) in found.items():
        out[key] = None if d is None else {"difference": d.get("estimate"), "ci_low": d.get("ci_low"),
                                           "ci_high": d.get("ci_high"), "n_claims": n}
    return out


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _cell(row: dict, name: str, key: str) -> str:
    """A Table-1 value with its 95% bootstrap interval where one was computed."""
    ci = (row.get("intervals") or {}).get(key) or {}
    if ci.get("ci_low") is None:
        return _fmt(row[name])
    return f"{_fmt(row[name])} [{_fmt(ci['ci_low'])}, {_fmt(ci['ci_high'])}]"


def _chance_cells(chance: dict | None) -> str:
    """Balanced accuracy with its interval, and the verdict against a verifier that reads nothing."""
    if not chance or chance.get("balanced_accuracy") is None:
        return "n/a | n/a"
    ci = chance["balanced_accuracy_ci"]
    bal = _fmt(_pct(chance["balanced_accuracy"]))
    if ci.get("ci_low") is not None:
        bal += f" [{_fmt(_pct(ci['ci_low']))}, {_fmt(_pct(ci['ci_high']))}]"
    verdict = (f"Acc {'yes' if chance['label_accuracy_above_chance'] else 'no'} "
               f"(majority {chance['majority_label']} {_fmt(_pct(chance['majority_rate']))}); "
               f"balanced {'yes' if chance['balanced_accuracy_above_chance'] else 'no'} "
               f"(1/k {_fmt(_pct(chance['balanced_accuracy_chance']))})")
    return f"{bal} | {verdict}"


def _ci(block: dict, key: str) -> str:
    """A control metric ×100 with its interval (none under the minimum claim count)."""
    iv = (block.get("intervals") or {}).get(key) or {}
    cell = _fmt(_pct(block.get(key)))
    return cell if iv.get("ci_low") is None else f"{cell} [{_fmt(_pct(iv['ci_low']))}, {_fmt(_pct(iv['ci_high']))}]"


def _arm_tables(summary: dict, arms: tuple[str, ...], title: str, columns: tuple[str, ...], cells) -> list[str]:
    """Per set, a table of the systems whose FAE row has one of ``arms``: ``cells(row)`` gives the columns."""
    lines = []
    for s, per in summary["sets"].items():
        rows = [(system, e["fae"]) for system, e in per.items() if any((e.get("fae") or {}).get(a) for a in arms)]
        if rows:
            lines += [f"## {s}: {title}", "", "| system | " + " | ".join(columns) + " |",
                      "|---|" + "---|" * len(columns)]
            lines += ["| " + " | ".join([system, *cells(row)]) + " |" for system, row in rows]
            lines.append("")
    return lines


def _control_cells(row: dict) -> list[str]:
    """The control arm (IS and IS_ctrl over the same claims) and the gold-only pools."""
    c, g = row.get("control") or {}, row.get("gold_only") or {}
    left = (c.get("n_left_out") or [0])[0]
    return [f"{c.get('n_control_claims', 'n/a')} ({left})", _ci(c, "IS"), _ci(c, "IS_ctrl"), _ci(c, "IS_minus_IS_ctrl"),
            _fmt(_pct(g.get("label_accuracy"))), _fmt(_pct(g.get("nei_answer_rate")))]


def _sufficiency_cells(row: dict) -> list[str]:
    """The cited-only arm and the pool-size sweep's accuracy curve."""
    c, w = row.get("cited_only") or {}, row.get("size_sweep") or {}
    curve = " / ".join(f"{_fmt(_pct(k['label_accuracy']))} ({k['n_claims']})" for k in w.get("per_k") or [])
    return [_fmt(row.get("Acc")), str(c.get("n_claims", "n/a")), _fmt(_pct(c.get("label_accuracy"))),
            _fmt(_pct(c.get("nei_answer_rate"))), curve or "n/a", _fmt(_pct(w.get("sweep_nei_share")))]


def markdown(summary: dict) -> str:
    lines = [f"# {summary['model_id']}: FAE summary", ""]
    for s, per in summary["sets"].items():
        lines += [f"## {s}", "", "| system | n | " + " | ".join(n for n, _ in TABLE1)
                  + " | a_r (r = 0..R) | balanced Acc | above chance (Acc > majority share; balanced > 1/k) "
                  "| balanced Acc, label-token scoring | above chance, label-token |",
                  "|---|---|" + "---|" * len(TABLE1) + "---|---|---|---|---|"]
        for system, entry in per.items():
            row = entry.get("fae")
            if row is None:
                lines.append(f"| {system} | missing |" + " |" * len(TABLE1) + " | | |")
                continue
            traj = " / ".join(_fmt(a) for a in row["round_accuracy"])
            lines.append(f"| {system} | {row['n_claims']} | " + " | ".join(_cell(row, n, k) for n, k in TABLE1)
                         + f" | {traj} | {_chance_cells(row.get('chance'))} "
                         f"| {_chance_cells(row.get('chance_label_token'))} |")
        lines.append("")
    lines += _arm_tables(summary, ("control", "gold_only"),
                         "control arm and gold-only pools (×100; 95% bootstrap over claims)",
                         ("control claims (left out)", "IS (same claims)", "IS_ctrl", "IS − IS_ctrl", "gold-only Acc",
                          "gold-only NEI"), _control_cells)
    lines += _arm_tables(summary, ("cited_only", "size_sweep"),
                         "sufficiency (×100): the cited lines alone, gold plus k other lines",
                         ("round-0 Acc", "cited-only claims", "cited-only Acc", "cited-only NEI",
                          "size sweep: Acc at k = 0, 1, ... (claims)", "sweep NEI share"), _sufficiency_cells)
    for s, diffs in (summary.get("differences") or {}).items():
        if not diffs:
            continue
        lines += [f"## {s}: paired differences from {summary['baseline']} (×100; one bootstrap over the same claims)",
                  "", "| system | " + " | ".join(DIFFERENCE_HEADINGS) + " |", "|---|" + "---|" * len(DIFFERENCES)]
        for system, d in diffs.items():
            cells = []
            for key in DIFFERENCES:
                v = d.get(key) or {}
                cell = _fmt(v.get("difference"))
                if v.get("ci_low") is not None and (v.get("n_claims") or 0) >= MIN_INTERVAL_UNITS:
                    cell += f" [{_fmt(v['ci_low'])}, {_fmt(v['ci_high'])}]"
                cells.append(f"{cell} (n {v.get('n_claims') or 0})")
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
        lines.append("")
    if summary["step_times"]:
        lines += ["## Wall time per step", "", "| step (its output) | seconds |", "|---|---|"]
        lines += [f"| `{t['done']}` | {t['seconds']} |" for t in summary["step_times"]]
        lines += [f"| **total** | **{summary['wall_seconds_total']}** |", ""]
    if summary["missing"]:
        lines += ["Missing: " + ", ".join(summary["missing"]), ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".", help="the directory reproduce.sh ran in (default .)")
    p.add_argument("--model-id", required=True)
    p.add_argument("--systems", nargs="+", required=True)
    p.add_argument("--sets", nargs="+", required=True)
    p.add_argument("--output", required=True, help="summary JSON; the Markdown table goes beside it (.md)")
    p.add_argument("--baseline", help="the system every other is compared with, paired over the same claims "
                                      "(default: sft when it is one of --systems)")
    args = p.parse_args()
    baseline = args.baseline or ("sft" if "sft" in args.systems else None)
    summary = summarize(Path(args.root), args.model_id, args.systems, args.sets, baseline)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(summary))
    print(f"summarize: {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
