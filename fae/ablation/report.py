"""`fae report`: the paper's Table 1 and Figure 5 for one or more FAE runs.

``report.md`` has one row per run with Prec, Rec, F1 (round-0 evidence,
micro), Acc, Strict, IS, ER, IO (×100, two decimals), then flip and reuse
figures, per-round shares of invalid, NOT_ENOUGH_INFO and cut-off answers, and
a warning for any run whose round-0 accuracy is below 0.5: a verifier that
mostly answers NOT_ENOUGH_INFO scores IO ≈ 100, so IS/ER/IO only mean
something for a verifier that reads the evidence. IS/ER/IO are "n/a" with
the reason when ``a_0`` is 0 or undefined; a run with cut-off answers gets a
hint to raise ``--max-new-tokens``; NEI-gold claims left out are counted.
``trajectory.png`` plots a_r against r for every run with the ideal
trajectory (a_0 = 1, then 0) dashed.

Soft FAE (:mod:`fae.ablation.soft_metrics`): a table of soft IS, the P(NEI) area and
round-0 ECE beside IS, and — when any run has label probabilities —
``soft_trajectory.png`` (mean P(gold) and P(NEI) per round with 95%
percentile-bootstrap bands over claims) and ``reliability.png`` (round 0).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from real_fae_core.atomicio import atomic_file, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, only_names
from fae.ablation.metrics import compute_metrics, truncation_note, undefined_reason
from fae.ablation.population import evidence_claims
from fae.ablation.runio import load_run
from fae.ablation.soft_metrics import claim_curves, soft_metrics
from fae.ablation.sufficiency import cited_only_metrics, size_sweep_metrics
from fae.intervals import draw_units, percentile_bounds

LOW_ACCURACY = 0.5
SUFFICIENCY_PNG = "sufficiency.png"
TABLE_COLUMNS = (
    ("Prec", "evidence_precision"),
    ("Rec", "evidence_recall"),
    ("F1", "evidence_f1"),
    ("Acc", "label_accuracy"),
    ("Strict", "strict_accuracy"),
    ("IS", "IS"),
    ("ER", "ER"),
    ("IO", "IO"),
)


@dataclasses.dataclass
class ReportConfig(CommandConfig):
    """`fae report`: the Table-1 report of one or more finished runs."""

    runs: list[str] = option(positional=True, metavar="RUN_DIR", help="fae run output directories")
    output: str = option(metavar="DIR", help="where report.md and trajectory.png go")
    names: list[str] | None = option(None, help="row names (default: the run directory names)")


def run(config: ReportConfig) -> CommandResult:
    """`fae report` as a function: report.md and trajectory.png in ``config.output`` (their paths in
    ``outputs``); ``--names``, when given, must name every run."""
    if config.names and len(config.names) != len(config.runs):
        raise UserError(f"--names has {len(config.names)} names for {len(config.runs)} runs")
    claim_dir(config.output, "fae report", inputs=config.runs, legacy=only_names("report.md", "trajectory.png")).mark()
    md, png = write_report(config.runs, config.output, names=config.names)
    print(f"fae report: wrote {md} and {png}")
    return CommandResult(outputs={"report": str(md), "plot": str(png)})


def load_reported(run_dir: str | Path, name: str | None = None) -> dict[str, Any]:
    """Name, metrics, config and claims of a finished run for the report, read by
    :func:`fae.ablation.runio.load_run` (the one run reader).

    An unfinished run, or one whose metrics.json was not computed from its
    claims.jsonl, is refused; a missing metrics.json is recomputed from the claims.
    """
    data = load_run(run_dir)
    metrics = data.metrics if data.metrics is not None else compute_metrics(data.claims)
    if "soft" not in metrics:  # metrics.json of a run made before soft FAE
        metrics = {**metrics, "soft": soft_metrics(data.claims)}
    for key, compute in (("cited_only", cited_only_metrics), ("size_sweep", size_sweep_metrics)):
        if key not in metrics:  # metrics.json of a run made before the sufficiency arms
            metrics = {**metrics, key: compute(data.claims)}
    return {"name": name or data.path.resolve().name, "dir": str(data.path), "metrics": metrics,
            "config": data.config, "claims": data.claims}


def pct(x: float | None) -> str:
    """A rate as a percentage with two decimals (``0.5`` is ``50.00``); None (undefined) is ``n/a``."""
    return "n/a" if x is None else f"{100 * x:.2f}"


def fae_reason(m: dict) -> str | None:
    """Why IS/ER/IO are n/a; for a metrics.json of older code (no ``IS_reason``) derived from a_r."""
    if "IS_reason" in m:
        return m["IS_reason"]
    return undefined_reason(m.get("round_accuracy") or [None])


def score_cell(m: dict, key: str) -> str:
    """IS/ER/IO as shown: never a number when a_0 is 0 or undefined (an old metrics.json said IO = 100)."""
    return "n/a" if fae_reason(m) else pct(m.get(key))


def per_round(xs) -> str:
    """A per-round list (×100) as ``r0 / r1 / ...``; n/a for a list this run does not have."""
    return " / ".join(pct(x) for x in xs) if xs and any(x is not None for x in xs) else "n/a"


def _a0(m: dict) -> float | None:
    acc = m.get("round_accuracy") or [None]
    return acc[0]


def warnings_for(run: dict) -> list[str]:
    """The report's warnings about one run (low round-0 accuracy, IS/ER/IO n/a, NEI claims left out,
    truncated answers), as markdown lines; empty when the run's numbers can be read as they are."""
    m = run["metrics"]
    out = []
    a0 = _a0(m)
    if a0 is None or a0 < LOW_ACCURACY:
        shown = "undefined" if a0 is None else f"{a0:.2f}"
        out.append(
            f"**Warning — {run['name']}: round-0 accuracy {shown} is below {LOW_ACCURACY}.** "
            "IS/ER/IO only mean something for a verifier that reads the evidence: one that mostly "
            "answers NOT_ENOUGH_INFO scores IO ≈ 100."
        )
    reason = fae_reason(m)
    if reason:
        out.append(f"{run['name']}: IS/ER/IO are n/a: {reason}.")
    if m.get("n_excluded_nei"):
        out.append(f"{run['name']}: {m['n_excluded_nei']} claims with gold label NOT_ENOUGH_INFO are not "
                   "evaluated (SPEC §1); every number is over the SUPPORT/REFUTE claims.")
    decoding = (run.get("config") or {}).get("decoding") or {}
    note = truncation_note(m, decoding.get("max_new_tokens"))
    if note:
        out.append(f"**Warning — {run['name']}: {note}.**")
    return out


def render_markdown(runs: Sequence[dict]) -> str:
    """The whole report.md of the runs (each a :func:`load_reported` mapping), warnings first."""
    lines = ["# FAE report", ""]
    for run in runs:
        lines += [f"> {w}" for w in warnings_for(run)]
    if any(warnings_for(r) for r in runs):
        lines.append("")
    lines += [
        "Evidence selection and veracity at round 0, FAE metrics over the ablation rounds (×100).",
        "",
        "| Model | Prec | Rec | F1 | Acc | Strict | IS | ER | IO |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        m = run["metrics"]
        cells = [score_cell(m, k) if k in ("IS", "ER", "IO") else pct(m.get(k)) for _, k in TABLE_COLUMNS]
        lines.append("| " + " | ".join([run["name"]] + cells) + " |")
    lines += control_table(runs)
    lines += sufficiency_table(runs)
    lines += soft_table(runs)
    lines += [
        "",
        "## Trajectory, flips, invalid answers",
        "",
        "| Model | claims | R | a_r (×100) | FEVER | flip | any flip | invalid r0 | invalid max | "
        "halluc. ids r0 | model calls | reused |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        m = run["metrics"]
        inv = [x for x in (m.get("invalid_rate") or []) if x is not None]
        hal = m.get("hallucinated_id_rate") or [None]
        traj = " / ".join(pct(a) for a in m.get("round_accuracy") or [])
        lines.append(
            f"| {run['name']} | {m.get('n_claims')} | {m.get('rounds')} | {traj} | {pct(m.get('fever_score'))} "
            f"| {pct(m.get('flip_rate'))} | {pct(m.get('any_flip_rate'))} | {pct(inv[0] if inv else None)} "
            f"| {pct(max(inv) if inv else None)} | {pct(hal[0])} | {m.get('model_calls')} | {m.get('reused_calls')} |"
        )
    lines += [
        "",
        "## Answers per round",
        "",
        "Share of claims (×100) at rounds 0 / 1 / ... / R; n/a: the run did not record it.",
        "",
        "| Model | invalid | NOT_ENOUGH_INFO | cut off at max_new_tokens |",
        "|---|---|---|---|",
    ]
    for run in runs:
        m = run["metrics"]
        lines.append(f"| {run['name']} | {per_round(m.get('invalid_rate'))} | {per_round(m.get('nei_answer_rate'))} "
                     f"| {per_round(m.get('truncated_rate'))} |")
    lines += ["", "## Runs", ""]
    for run in runs:
        c = run["config"]
        lines.append(
            f"- **{run['name']}** (`{run['dir']}`): backend {c.get('backend', '?')}, model `{c.get('model', '?')}`"
            + (f", adapter `{c['adapter']}`" if c.get("adapter") else "")
            + (f", records `{c.get('records')}`" if c.get("records") else "")
            + (", constrained decoding: on" if c.get("constrained_decoding") else "")  # docs/structured.md
            + f", line ids {c.get('line_ids') or 'original'}"
            + (f", control {c['control']} (seed {c['control_seed']})" if c.get("control") not in (None, "none")
               else "")
            + (f", size sweep seed {c['sweep_seed']}" if c.get("size_sweep") else "")
        )
    lines += ["", "![a_r against r](trajectory.png)", ""]
    if has_sweep(runs):
        lines += ["![accuracy against the number of other lines beside the gold](sufficiency.png)", ""]
    if has_soft(runs):
        lines += ["![mean label probabilities against r](soft_trajectory.png)", "",
                  "![round-0 reliability diagram](reliability.png)", ""]
    return "\n".join(lines)


def with_ci(block: dict, key: str) -> str:
    """A control metric (×100) with its bootstrap interval, when it has one."""
    iv = (block.get("intervals") or {}).get(key) or {}
    cell = pct(block.get(key))
    return cell if iv.get("ci_low") is None else f"{cell} [{pct(iv['ci_low'])}, {pct(iv['ci_high'])}]"


def control_table(runs: Sequence[dict]) -> list[str]:
    """The control arm and the gold-only pools (SPEC §6, :mod:`fae.ablation.control`), ×100."""
    if not any(r["metrics"].get("control") or r["metrics"].get("gold_only") for r in runs):
        return []
    lines = [
        "",
        "## Control arm and gold-only pools: is IS evidence?",
        "",
        "The control asks each round's full pool minus as many lines as the ablation removed, drawn from lines "
        "neither cited nor gold. IS and IS_ctrl are over the claims with a round-1 control (paired; 95% "
        "percentile bootstrap over claims): a verifier that abstains whenever a line goes has IS_ctrl ≈ IS, "
        "one that reads its evidence IS_ctrl ≈ 0. Gold-only: the gold sentences alone, beside round 0 on "
        "the same claims. Gap shown: the share of round-1 ablated / control pools whose removal leaves a hole "
        "before or between kept lines (a missing number under original line ids); a control matched on the gap "
        "(`--control matched`) has equal shares, and unmatched counts the claims where no such draw existed. "
        "n/a: the run was made without it (`--control none`, `--no-gold-only`).",
        "",
        "| Model | control claims (left out) | IS | IS_ctrl | IS − IS_ctrl | ER_ctrl | a_r^ctrl (r ≥ 1) "
        "| gap shown r1 (ablated / control) | unmatched r1 | gold-only Acc | gold-only NEI | Acc r0 (same claims) |",
        "|---|---:|---|---|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for run in runs:
        ctrl, gold = run["metrics"].get("control"), run["metrics"].get("gold_only")
        if ctrl:
            cells = [f"{ctrl['n_control_claims']} ({ctrl['n_left_out'][0] if ctrl['n_left_out'] else 0})",
                     with_ci(ctrl, "IS"), with_ci(ctrl, "IS_ctrl"), with_ci(ctrl, "IS_minus_IS_ctrl"),
                     pct(ctrl.get("ER_ctrl")), per_round(ctrl.get("round_accuracy_ctrl")), *gap_cells(ctrl)]
        else:
            cells = ["n/a"] * 8
        if gold:
            cells += [pct(gold["label_accuracy"]), pct(gold["nei_answer_rate"]), pct(gold["round0_label_accuracy"])]
        else:
            cells += ["n/a"] * 3
        lines.append("| " + " | ".join([run["name"]] + cells) + " |")
    return lines


def gap_cells(ctrl: dict) -> list[str]:
    """The control table's gap cells (round 1): shares of ablated / control pools showing a hole, unmatched."""
    gap = ctrl.get("gap")
    if not gap or not gap["ablation_gap_share"]:
        return ["n/a", "n/a"]
    return [f"{pct(gap['ablation_gap_share'][0])} / {pct(gap['control_gap_share'][0])}", str(gap["n_unmatched"][0])]


def sufficiency_table(runs: Sequence[dict]) -> list[str]:
    """Sufficiency (SPEC §6, :mod:`fae.ablation.sufficiency`): gold-only, cited-only and the size sweep, ×100."""
    if not any(r["metrics"].get(k) for r in runs for k in ("gold_only", "cited_only", "size_sweep")):
        return []
    lines = [
        "",
        "## Sufficiency: does it answer on the evidence alone?",
        "",
        "Each claim asked on its gold lines alone, on the lines its round-0 answer cited alone (its own "
        "rationale), and on its gold lines plus k other lines (k = 0 .. n − |gold| − 1, added in a seeded "
        "order: the size sweep). Acc beside round 0's Acc on the same claims; kept: of the claims right at "
        "round 0, the share still right on that pool. A verifier that reads its evidence keeps its round-0 "
        "accuracy on all of them; one that learned \"a short pool means NOT_ENOUGH_INFO\" falls on small k. "
        "n/a: the run was made without the arm (`--no-gold-only`, `--no-cited-only`, `--no-size-sweep`).",
        "",
        "| Model | gold-only claims | Acc (r0) | NEI | kept | cited-only claims | Acc (r0) | NEI | kept "
        "| sweep claims | Acc by k = 0 / 1 / … | lowest | sweep Acc (r0) | NEI by k |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|---|",
    ]
    for run in runs:
        cells = []
        for key in ("gold_only", "cited_only"):
            b = run["metrics"].get(key)
            cells += ([f"{b['n_claims']} ({b['n_skipped']} skipped)",
                       f"{pct(b['label_accuracy'])} ({pct(b['round0_label_accuracy'])})",
                       pct(b["nei_answer_rate"]), pct(b.get("kept_rate"))] if b else ["n/a"] * 4)
        sw = run["metrics"].get("size_sweep")
        if sw:
            cells += [f"{sw['n_claims']} ({sw['n_skipped']} skipped)",
                      per_round([row["label_accuracy"] for row in sw["per_k"]]), pct(sw["min_accuracy"]),
                      f"{pct(sw['sweep_accuracy'])} ({pct(sw['round0_label_accuracy'])})",
                      per_round([row["nei_answer_rate"] for row in sw["per_k"]])]
        else:
            cells += ["n/a"] * 5
        lines.append("| " + " | ".join([run["name"]] + cells) + " |")
    counts = [f"{run['name']}: " + ", ".join(f"k = {row['k']}: {row['n_claims']}" for row in sw["per_k"])
              for run in runs if (sw := run["metrics"].get("size_sweep"))]
    if counts:
        lines += ["", "Claims per k (a claim of n lines has k up to n − |gold| − 1): " + "; ".join(counts) + "."]
    return lines


def has_sweep(runs: Sequence[dict]) -> bool:
    """Whether any run measured an evidence-size sweep (so the report has a sufficiency figure)."""
    return any((r["metrics"].get("size_sweep") or {}).get("per_k") for r in runs)


def sufficiency_figure(runs: Sequence[dict]):
    """Accuracy (solid) and NOT_ENOUGH_INFO share (dotted) against k, the other lines beside the gold, for
    every run with a size sweep."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 3.8), dpi=120)
    swept = [run for run in runs if (run["metrics"].get("size_sweep") or {}).get("per_k")]
    K = max(len(run["metrics"]["size_sweep"]["per_k"]) for run in swept)
    for k, run in enumerate(swept):
        rows = run["metrics"]["size_sweep"]["per_k"]
        style = series_style(k, len(swept))
        xs = [row["k"] for row in rows if row["label_accuracy"] is not None]
        line = _plot_series(ax, xs, [rows[x]["label_accuracy"] for x in xs], style, label=f"{run['name']} Acc",
                            zorder=3 + k)
        ax.plot([x + style["offset"] for x in xs], [rows[x]["nei_answer_rate"] for x in xs], ":",
                color=line.get_color(), lw=1.2, label=f"{run['name']} NEI share", zorder=2)
    ax.set_xticks(range(K))
    ax.set_xlabel("k: other lines beside the gold lines")
    ax.set_ylabel("share of claims")
    return _finish_share_plot(fig, ax)


def has_soft(runs: Sequence[dict]) -> bool:
    """Whether any run kept label probabilities (so the report has the soft-metric figures)."""
    return any((r["metrics"].get("soft") or {}).get("n_with_probs") for r in runs)


def soft_table(runs: Sequence[dict]) -> list[str]:
    """Soft FAE beside IS (×100): soft IS, P(NEI) area, round-0 ECE and the mean curves."""
    lines = [
        "",
        "## Soft FAE: label probabilities",
        "",
        "Mean probability of the gold label and of NOT_ENOUGH_INFO at the answer's label position "
        "(×100, rounds 0 / 1 / ... / R); soft IS = 1 − E[P_1(gold)] / E[P_0(gold)]; NEI area = mean "
        "P(NEI) over rounds 1..R; ECE at round 0 (10 bins, argmax correctness). n/a: no probabilities.",
        "",
        "| Model | IS | soft IS | NEI area | ECE r0 | P(gold) | P(NEI) | claims with probs |",
        "|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for run in runs:
        m, soft = run["metrics"], run["metrics"].get("soft") or {}
        lines.append(f"| {run['name']} | {score_cell(m, 'IS')} | {pct(soft.get('soft_IS'))} "
                     f"| {pct(soft.get('nei_area'))} | {pct(soft.get('ece'))} | {per_round(soft.get('p_gold'))} "
                     f"| {per_round(soft.get('p_nei'))} | {soft.get('n_with_probs', 0)} |")
    for run in runs:
        soft = run["metrics"].get("soft") or {}
        if soft and soft.get("soft_IS") is None and soft.get("soft_IS_reason"):
            lines.append(f"\n{run['name']}: soft metrics n/a: {soft['soft_IS_reason']}.")
    return lines


def bootstrap_band(curves: Sequence[Sequence[float | None]], n_resamples: int = 1000, seed: int = 0,
                   confidence: float = 0.95):
    """(mean, low, high) per round: percentile bootstrap over claims (claims with a value at that round);
    the rounds draw one after another from one generator (fae.intervals: the draw and the percentile rule)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    R1 = max((len(c) for c in curves), default=0)
    mean, lo, hi = [], [], []
    for r in range(R1):
        xs = np.array([c[r] for c in curves if r < len(c) and c[r] is not None], dtype=float)
        if xs.size == 0:
            mean.append(None), lo.append(None), hi.append(None)
            continue
        draws = xs[draw_units(xs.size, n_resamples, rng)].mean(axis=1)
        # numpy's spelling: the committed reports' bands were drawn with it (the spellings differ in the last bits)
        low, high = percentile_bounds(draws, confidence, spelling="numpy")
        mean.append(float(xs.mean()))
        lo.append(float(low))
        hi.append(float(high))
    return mean, lo, hi


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", (0, (6, 2)), "-.", ":")
MAX_OFFSET = 0.12  # rounds: the widest shift of a series, well inside the gap to the next integer round


def series_style(k: int, n: int) -> dict[str, Any]:
    """How run ``k`` of ``n`` is drawn so that no series hides another: its own marker (drawn
    smaller the later it comes, so one under another still shows its rim), its own line style and
    a small shift along r (±MAX_OFFSET at most) — two runs with equal values stay visible."""
    step = min(0.07, 2 * MAX_OFFSET / max(n - 1, 1))
    return {"marker": MARKERS[k % len(MARKERS)], "linestyle": LINESTYLES[k % len(LINESTYLES)],
            "markersize": max(4.0, 8.0 - 0.8 * k), "offset": (k - (n - 1) / 2) * step if n > 1 else 0.0}


def _plot_series(ax, xs: Sequence[int], ys: Sequence[float], style: dict, **kw):
    """One run's line at its shifted x positions (ticks stay on the integer rounds)."""
    return ax.plot([x + style["offset"] for x in xs], ys, marker=style["marker"], linestyle=style["linestyle"],
                   markersize=style["markersize"], lw=1.6, **kw)[0]


def _round_axis(ax, R: int, shifted: bool) -> None:
    """Integer round ticks only; the x label says when series are shifted."""
    ax.set_xticks(range(R + 1))
    ax.set_xlim(-0.4, R + 0.4)
    ax.set_xlabel("ablation round r" + (" (runs shifted slightly)" if shifted else ""))


def _legend_outside(ax, **kw):
    """The legend right of the axes, never over the data."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Save with the legend outside the axes inside the image, and free the figure."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def plot_soft(runs: Sequence[dict], out: str | Path) -> tuple[Path, Path]:
    """``soft_trajectory.png`` (P(gold), P(NEI) per round, bootstrap bands) and ``reliability.png``."""
    out = Path(out)
    return (_save(soft_trajectory_figure(runs), out / "soft_trajectory.png"),
            _save(reliability_figure(runs), out / "reliability.png"))


def soft_trajectory_figure(runs: Sequence[dict]):
    """Mean P(gold) and P(NOT_ENOUGH_INFO) per round with 95% bootstrap bands, styled like the trajectory."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(9.5, 3.8), dpi=120, sharey=True)
    R_all = 1
    for k, run in enumerate(runs):
        pop = evidence_claims(run.get("claims") or [])
        R = max((len(c["rounds"]) for c in pop), default=1) - 1
        R_all = max(R_all, R)
        curves = [claim_curves(c, R) for c in pop]
        style = series_style(k, len(runs))
        for ax, key in zip(axes, ("p_gold", "p_nei")):
            mean, lo, hi = bootstrap_band([c[key] for c in curves], seed=k)
            xs = [r for r, v in enumerate(mean) if v is not None]
            if not xs:
                continue
            line = _plot_series(ax, xs, [mean[r] for r in xs], style, label=run["name"])
            ax.fill_between([r + style["offset"] for r in xs], [lo[r] for r in xs], [hi[r] for r in xs],
                            color=line.get_color(), alpha=0.15)
    for ax, title in zip(axes, ("mean P(gold label)", "mean P(NOT_ENOUGH_INFO)")):
        _round_axis(ax, R_all, len(runs) > 1)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        _legend_outside(axes[1], title="95% bootstrap bands", title_fontsize=7)
    fig.tight_layout()
    return fig


def reliability_figure(runs: Sequence[dict]):
    """Round-0 reliability diagram per run, the diagonal dashed."""
    fig, ax = _pyplot().subplots(figsize=(4.5, 4.2), dpi=120)
    ax.plot([0, 1], [0, 1], "--", color="0.35", lw=1.2, label="perfectly calibrated")
    for k, run in enumerate(runs):
        bins = [b for b in ((run["metrics"].get("soft") or {}).get("reliability") or []) if b["n"]]
        if bins:
            ece = run["metrics"]["soft"].get("ece")
            style = {**series_style(k, len(runs)), "offset": 0.0}  # a continuous axis: no shift
            _plot_series(ax, [b["confidence"] for b in bins], [b["accuracy"] for b in bins], style,
                         label=f"{run['name']} (ECE {pct(ece)})")
    ax.set_xlabel("round-0 confidence (max label probability)")
    ax.set_ylabel("accuracy (argmax = gold)")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_trajectories(runs: Sequence[dict], path: str | Path) -> Path:
    """a_r against r for every run, ideal (1 then 0) dashed — the paper's Figure 5."""
    return _save(trajectory_figure(runs), Path(path))


def trajectory_figure(runs: Sequence[dict]):
    """The Figure-5 plot as a matplotlib figure: every run visible (:func:`series_style`), the
    ideal dashed under the data, integer round ticks, the legend outside the axes."""
    fig, ax = _pyplot().subplots(figsize=(6.5, 3.8), dpi=120)
    R = max((len(r["metrics"].get("round_accuracy") or []) for r in runs), default=1) - 1
    R = max(R, 1)
    ax.plot(range(R + 1), [1.0] + [0.0] * R, "--", color="0.35", lw=1.4, label="ideal", zorder=1)
    for k, run in enumerate(runs):
        acc = run["metrics"].get("round_accuracy") or []
        xs = [r for r, a in enumerate(acc) if a is not None]
        _plot_series(ax, xs, [acc[r] for r in xs], series_style(k, len(runs)), label=run["name"], zorder=3 + k)
    _round_axis(ax, R, len(runs) > 1)
    ax.set_ylabel("accuracy $a_r$")
    return _finish_share_plot(fig, ax)


def _finish_share_plot(fig, ax):
    """A plot of shares in [0, 1]: the y range with a margin so points at 0 and 1 show, a light grid, the
    legend outside the axes."""
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def write_report(run_dirs: Sequence[str | Path], output: str | Path,
                 names: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Write report.md and the figures of ``run_dirs`` into ``output`` (created); (report.md, trajectory.png).
    A figure these runs have no data for is removed, so one of an earlier report cannot pass for theirs."""
    runs = [load_reported(d, names[i] if names else None) for i, d in enumerate(run_dirs)]
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    atomic_write_text(md, render_markdown(runs))
    png = plot_trajectories(runs, out / "trajectory.png")
    if has_sweep(runs):
        _save(sufficiency_figure(runs), out / SUFFICIENCY_PNG)
    else:
        (out / SUFFICIENCY_PNG).unlink(missing_ok=True)
    if has_soft(runs):
        plot_soft(runs, out)
    else:  # figures of an earlier report must not pass for these runs'
        for name in ("soft_trajectory.png", "reliability.png"):
            (out / name).unlink(missing_ok=True)
    return md, png
