"""PAVE's ``pave.md`` and printed summary from the analysis result."""

from __future__ import annotations

from fae.comparison import pave_metrics as pm
from fae.comparison.pave_prompts import LEGACY_KIND


def _p(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


KIND_TITLES = {"entity": "counter-entity", "semantic": "counter-semantic"}


def render_markdown(res: dict, cfg: dict) -> str:
    pr = res["profile"]
    kinds = {k: v for k, v in (res.get("kinds") or {}).items() if k != LEGACY_KIND}
    lines = [
        "# PAVE diagnostics",
        "",
        f"- model `{cfg['model']}`" + (f", adapter `{cfg['adapter']}`" if cfg.get("adapter") else "")
        + f" ({cfg['backend']}); {cfg['samples']} samples per prompt at temperature {cfg['temperature']}",
    ]
    if not kinds:
        lines.append(f"- {res['n_claims']} claims, {pr['n_with_counterfactual']} with counterfactual evidence")
        lines += _kind_sections(pr, res["arbitration"], "")
    else:
        lines.append(f"- {res['n_claims']} claims; with counterfactual evidence: "
                     + ", ".join(f"{k} {v['profile']['n_with_counterfactual']}" for k, v in kinds.items()))
        lines += [
            "",
            "## By kind of counterfactual evidence",
            "",
            "| Kind | Claims | PR | CR | Margin | OI (KK) | OI (UK) | τ | IE | CE | OA |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, v in kinds.items():
            p, a = v["profile"], v["arbitration"]
            lines.append(f"| {KIND_TITLES.get(k, k)} | {p['n_with_counterfactual']} | {_p(p['PR'])} | {_p(p['CR'])} "
                         f"| {_f(p['Margin'])} | {_f(p['states']['KK']['OI'])} | {_f(p['states']['UK']['OI'])} "
                         f"| {_f(a['tau'])} | {_p(a['IE'])} | {_p(a['CE'])} | {_p(a['OA'])} |")
        for k, v in kinds.items():
            lines += _kind_sections(v["profile"], v["arbitration"], f": {KIND_TITLES.get(k, k)}")
    if res["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def _kind_sections(pr: dict, arb: dict, suffix: str) -> list[str]:
    st = pr["states"]
    lines = [
        "",
        f"## Arbitration profile{suffix}",
        "",
        "| State | Ratio | Rate | OI | Δ |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in pm.STATES:
        r = st[s]
        if s[1] == "K":
            lines.append(f"| {r['name']} (persistence) | {_p(r['ratio'])} | PR {_p(r['PR'])} | {_f(r['OI'])} "
                         f"| correct drop {_p(r['correct_drop'])} |")
        else:
            lines.append(f"| {r['name']} (correction) | {_p(r['ratio'])} | CR {_p(r['CR'])} | {_f(r['OI'])} "
                         f"| wrong reduction {_p(r['wrong_reduction'])} |")
    lines += [
        "",
        f"CR {_p(pr['CR'])}, PR {_p(pr['PR'])}, **Margin {_f(pr['Margin'])}** "
        f"(Known {_f(pr['margin_known'])}, Unknown {_f(pr['margin_unknown'])}, sum {_f(pr['margin_sum'])}). "
        f"Correct rate {_p(pr['correct_rate_prior'])} → {_p(pr['correct_rate_after'])} under counterfactual "
        f"evidence; wrong rate {_p(pr['wrong_rate_prior'])} → {_p(pr['wrong_rate_after'])} with gold evidence.",
        "",
        f"## JSD arbitration{suffix}",
        "",
        f"Stability: {', '.join(arb['stability'])}; τ = {_f(arb['tau'])} tuned on {arb['n_tune']} claims, "
        f"evaluated on {arb['n_test']}.",
        "",
        "| Method | IE | CE | OA |",
        "| --- | --- | --- | --- |",
        f"| JSD arbitration | {_p(arb['IE'])} | {_p(arb['CE'])} | {_p(arb['OA'])} |",
        f"| claim only | {_p(arb['baselines']['claim_only']['IE'])} | {_p(arb['baselines']['claim_only']['CE'])} "
        f"| {_p(arb['baselines']['claim_only']['OA'])} |",
        f"| evidence only | {_p(arb['baselines']['evidence_only']['IE'])} "
        f"| {_p(arb['baselines']['evidence_only']['CE'])} | {_p(arb['baselines']['evidence_only']['OA'])} |",
    ]
    return lines


def summary_lines(res: dict) -> list[str]:
    """One printed line per kind of counterfactual evidence (one line when there is a single pool or none)."""
    rows = [(k, v["profile"], v["arbitration"]) for k, v in (res.get("kinds") or {}).items() if k != LEGACY_KIND]
    if not rows:
        rows = [(None, res["profile"], res["arbitration"])]
    return [(f"{k:<9}" if k else "") + f"Margin {_f(pr['Margin'])}  CR {_p(pr['CR'])}  PR {_p(pr['PR'])}  |  "
            f"JSD rule τ={_f(arb['tau'])}: CE {_p(arb['CE'])} IE {_p(arb['IE'])} OA {_p(arb['OA'])}"
            for k, pr, arb in rows]
