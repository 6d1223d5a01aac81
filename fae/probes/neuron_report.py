"""``neurons.md`` and the area-proportional two-circle Venn figure of the overlap."""

from __future__ import annotations

import math
from pathlib import Path

from real_fae_core.atomicio import atomic_file


def lens_area(r1: float, r2: float, d: float) -> float:
    """Area where two circles of radii ``r1``, ``r2`` with centres ``d`` apart overlap (0 when apart, the
    smaller disc when one holds the other)."""
    if d >= r1 + r2:
        return 0.0
    if d <= abs(r1 - r2):
        return math.pi * min(r1, r2) ** 2
    a1 = r1 * r1 * math.acos((d * d + r1 * r1 - r2 * r2) / (2 * d * r1))
    a2 = r2 * r2 * math.acos((d * d + r2 * r2 - r1 * r1) / (2 * d * r2))
    a3 = 0.5 * math.sqrt((-d + r1 + r2) * (d + r1 - r2) * (d - r1 + r2) * (d + r1 + r2))
    return a1 + a2 - a3


def venn_distance(r1: float, r2: float, area: float) -> float:
    """Centre distance at which two circles overlap by ``area`` (bisection)."""
    lo, hi = abs(r1 - r2), r1 + r2
    if area <= 0:
        return hi
    if area >= math.pi * min(r1, r2) ** 2:
        return lo
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if lens_area(r1, r2, mid) > area:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def plot_venn(stats: dict, path: Path, title: str) -> None:
    """Two circles whose areas and overlap are the evidence, knowledge and shared neuron counts, as a PNG at
    ``path`` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle

    na, nb, ni = stats["evidence_size"], stats["knowledge_size"], stats["intersection"]
    scale = max(na, nb, 1)
    r1, r2 = math.sqrt(na / scale / math.pi), math.sqrt(nb / scale / math.pi)
    d = venn_distance(r1, r2, ni / scale) if na and nb else r1 + r2 + 0.1
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.add_patch(Circle((0, 0), r1, color="tab:blue", alpha=0.4, label="evidence-based"))
    ax.add_patch(Circle((d, 0), r2, color="tab:orange", alpha=0.4, label="knowledge-based"))
    # Label each region at the midpoint of its extent along the centre line.
    ax.text((-r1 + min(d - r2, r1)) / 2, 0, f"{na - ni:,}", ha="center", va="center")
    ax.text((max(r1, d - r2) + d + r2) / 2, 0, f"{nb - ni:,}", ha="center", va="center")
    if ni:
        ax.text((max(-r1, d - r2) + min(r1, d + r2)) / 2, 0, f"{ni:,}", ha="center",
                va="center", fontweight="bold")
    pad = 0.15
    ax.set_xlim(-r1 - pad, d + r2 + pad)
    ax.set_ylim(-max(r1, r2) - pad, max(r1, r2) + pad)
    ax.set_aspect("equal")
    ax.axis("off")
    jac = stats["jaccard"]
    sub = f"evidence {na:,} · knowledge {nb:,} · both {ni:,}"
    if jac is not None:
        sub += f" · Jaccard {jac:.1%}"
    ax.set_title(f"{title}\n{sub}", fontsize=10)
    ax.legend(loc="lower center", ncol=2, fontsize=8, bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=150)
    plt.close(fig)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def markdown(result: dict, meta: dict) -> str:
    """The neuron-overlap report: overall sets and Jaccard, then one table row per layer and their sum."""
    o = result["overall"]
    lines = [
        "# MLP neuron overlap: evidence- vs knowledge-based prompts",
        "",
        f"Model `{meta['model']}`" + (f" + adapter `{meta['adapter']}`" if meta["adapter"] else "")
        + f"; {meta['n_claims']} claims; coverage {meta['coverage']:.0%}.",
        "",
        f"Overall (one ranking over all {o['n_neurons']:,} neurons): evidence set "
        f"{o['evidence_size']:,}, knowledge set {o['knowledge_size']:,}, intersection "
        f"{o['intersection']:,}; Jaccard {_pct(o['jaccard'])}, "
        f"{_pct(o['overlap_of_evidence'])} of the evidence set, "
        f"{_pct(o['overlap_of_knowledge'])} of the knowledge set.",
        "",
        "| layer | neurons | evidence | knowledge | both | Jaccard | ∩/evidence | ∩/knowledge |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = result["per_layer"] + [{"layer": "sum of layers", **result["per_layer_sum"]}]
    for r in rows:
        lines.append(
            f"| {r['layer']} | {r['n_neurons']} | {r['evidence_size']} | {r['knowledge_size']} | "
            f"{r['intersection']} | {_pct(r['jaccard'])} | {_pct(r['overlap_of_evidence'])} | "
            f"{_pct(r['overlap_of_knowledge'])} |"
        )
    return "\n".join(lines) + "\n"
