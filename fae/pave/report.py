"""PAVE's ``pave.md`` and printed summary from the analysis result."""

from __future__ import annotations

from fae.pave import metrics
from fae.pave.prompts import PLAIN_LIST_KIND


def _p(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def interval_text(pr: dict, key: str, fmt: str = "{:+.3f}") -> str:
    """" [low, high]" from the profile's bootstrap intervals, or "" where there is none."""
    ci = (pr.get("intervals") or {}).get(key) or {}
    if ci.get("ci_low") is None:
        return ""
    return f" [{fmt.format(ci['ci_low'])}, {fmt.format(ci['ci_high'])}]"


def margin_text(pr: dict, which: str = "") -> str:
    """A margin's value with its 95% interval, or "undefined: state X is empty" (``which``: "", "known" or
    "unknown")."""
    key = f"margin_{which}" if which else "Margin"
    why = pr.get(f"margin_{which}_undefined" if which else "margin_undefined") or []
    if why or pr.get(key) is None:
        return f"undefined: {'; '.join(why)}"
    return f"{pr[key]:+.3f}{interval_text(pr, key)}"


def rate_text(pr: dict, key: str) -> str:
    """A pooled rate (CR, PR) as a percentage with its 95% interval."""
    return _p(pr.get(key)) + interval_text(pr, key, "{:.1%}")


def filter_text(res: dict) -> str:
    """The refusal filter's line: on/off and what it removed, per state."""
    f = res.get("refusal_filter") or {}
    if not f.get("on"):
        return "refusal filtering off (--keep-refusals): abstaining priors are kept as wrong priors"
    by = ", ".join(f"{k} {v}" for k, v in f["removed_by_state"].items() if v) or "none"
    return (f"refusal filtering on (the paper's default): {f['removed']} of {f['claims_before']} claims removed "
            f"(claim-only majority NOT_ENOUGH_INFO or invalid; by state before filtering: {by})")


def rule_settings_text(arb: dict) -> str:
    """Which stability variant and which sampling settings produced IE/CE/OA."""
    return (f"{arb['variant_text']}, because {arb['variant_reason']}; K = {arb.get('runs', '?')} runs at "
            f"temperature {arb.get('temperature', '?')}; τ = {_f(arb['tau'])} tuned on {arb['n_tune']} held-out "
            f"claims, evaluated on {arb['n_test']}; τ grid: {arb['tau_grid']}")


KIND_TITLES = {"entity": "counter-entity", "semantic": "counter-semantic"}


def render_markdown(res: dict, cfg: dict) -> str:
    """The pave.md of a result (``res``, as pave.json holds it) and its config (``cfg``): the profile, per kind
    when there are several, the FAE check and the notes."""
    pr = res["profile"]
    kinds = {k: v for k, v in (res.get("kinds") or {}).items() if k != PLAIN_LIST_KIND}
    lines = [
        "# PAVE diagnostics",
        "",
        f"- model `{cfg['model']}`" + (f", adapter `{cfg['adapter']}`" if cfg.get("adapter") else "")
        + f" ({cfg['backend']}); states, CR and PR from {cfg['samples']} samples per prompt at temperature "
        f"{cfg['temperature']}; the JSD rule from {cfg.get('jsd_samples', cfg['samples'])} at temperature "
        f"{cfg.get('jsd_temperature', cfg['temperature'])}",
        f"- {filter_text(res)}",
    ]
    if pr is None:
        lines.append(f"- {res['n_claims']} claims after refusal filtering: nothing to profile (see Notes)")
    elif not kinds:
        lines.append(f"- {res['n_claims']} claims, {pr['n_with_counterfactual']} with counterfactual evidence")
        lines += _kind_sections(pr, res["arbitration"], "")
    else:
        lines.append(f"- {res['n_claims']} claims; with counterfactual evidence: "
                     + ", ".join(f"{k} {v['profile']['n_with_counterfactual']}" for k, v in kinds.items()))
        lines += [
            "",
            "## By kind of counterfactual evidence",
            "",
            "| Kind | Claims | PR | CR | Margin | Known margin | Unknown margin | pooled CR+PR−1 | OI (KK) "
            "| OI (UK) | τ | IE | CE | OA |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, v in kinds.items():
            p, a = v["profile"], v["arbitration"]
            lines.append(f"| {KIND_TITLES.get(k, k)} | {p['n_with_counterfactual']} | {_p(p['PR'])} | {_p(p['CR'])} "
                         f"| **{margin_text(p)}** | {margin_text(p, 'known')} | {margin_text(p, 'unknown')} "
                         f"| {_f(p['pooled_margin'])} | {_f(p['states']['KK']['OI'])} | {_f(p['states']['UK']['OI'])} "
                         f"| {_f(a['tau'])} | {_p(a['IE'])} | {_p(a['CE'])} | {_p(a['OA'])} |")
        for k, v in kinds.items():
            lines += _kind_sections(v["profile"], v["arbitration"], f": {KIND_TITLES.get(k, k)}")
    if res.get("fae_check"):
        lines += ["", "## Gold-evidence accuracy beside FAE round 0", ""] + fae_check_lines(res["fae_check"])
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
    for s in metrics.STATES:
        r = st[s]
        if s[1] == "K":
            lines.append(f"| {r['name']} (persistence) | {_p(r['ratio'])} | PR {_p(r['PR'])} | {_f(r['OI'])} "
                         f"| correct drop {_p(r['correct_drop'])} |")
        else:
            lines.append(f"| {r['name']} (correction) | {_p(r['ratio'])} | CR {_p(r['CR'])} | {_f(r['OI'])} "
                         f"| wrong reduction {_p(r['wrong_reduction'])} |")
    lines += [
        "",
        f"**Margin {margin_text(pr)}** (the paper's Table 1: Known-state margin PR_KK + CR_KU − 1 = "
        f"{margin_text(pr, 'known')}, plus Unknown-state margin PR_UK + CR_UU − 1 = {margin_text(pr, 'unknown')}). "
        f"Pooled over states: CR {rate_text(pr, 'CR')}, PR {rate_text(pr, 'PR')}, pooled CR + PR − 1 = "
        f"{_f(pr['pooled_margin'])}{interval_text(pr, 'pooled_margin')}. "
        f"Brackets: 95% percentile-bootstrap intervals over claims. "
        f"Correct rate {_p(pr['correct_rate_prior'])} → {_p(pr['correct_rate_after'])} under counterfactual "
        f"evidence; wrong rate {_p(pr['wrong_rate_prior'])} → {_p(pr['wrong_rate_after'])} with gold evidence.",
        "",
        f"## JSD arbitration{suffix}",
        "",
        f"IE/CE/OA below come from the {rule_settings_text(arb)}.",
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
    rows = [(k, v["profile"], v["arbitration"]) for k, v in (res.get("kinds") or {}).items() if k != PLAIN_LIST_KIND]
    if not rows and res["profile"] is not None:
        rows = [(None, res["profile"], res["arbitration"])]
    out = [(f"{k:<9}" if k else "") + f"Margin {margin_text(pr)}  CR {rate_text(pr, 'CR')}  PR {rate_text(pr, 'PR')}  |  "
           f"JSD rule ({arb['variant']}, K={arb.get('runs', '?')}, T={arb.get('temperature', '?')}) "
           f"τ={_f(arb['tau'])}: CE {_p(arb['CE'])} IE {_p(arb['IE'])} OA {_p(arb['OA'])}"
           for k, pr, arb in rows]
    out.append(filter_text(res))
    if res.get("fae_check"):
        out += fae_check_lines(res["fae_check"])
    return out


def fae_check_lines(chk: dict) -> list[str]:
    """PAVE's gold-evidence accuracy beside FAE's round-0 accuracy on the same claims, and the verdict."""
    lines = [f"PAVE gold-evidence accuracy {_p(chk['pave_gold_evidence_accuracy'])} vs FAE round-0 accuracy "
             f"{_p(chk['fae_round0_accuracy'])} on the same {chk['n_claims']} claims ({chk['fae_run']}): "
             f"difference {100 * chk['difference']:+.1f} points"]
    if chk["disagree"]:
        lines.append(f"DISAGREEMENT (> {chk['threshold_points']:.0f} points): {chk['explanation']}")
    return lines
