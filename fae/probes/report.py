"""`fae probe-report`: DirK trajectories of several checkpoints (the paper's Figure 6).

Reads the ``dirk.json`` of each probe directory and writes ``dirk.png`` (one
line with a shaded 95% CI band per checkpoint) and ``dirk.md`` (rounds x
checkpoints, ``mean [ci_low, ci_high]``), with what each checkpoint answers
on the claim-only prompt, where h(K) came from, and a flagged note for every
abstaining reference (DirK then measures drift toward abstaining) or invalid one
(every claim-only answer invalid). With several probes, a second table reads
them on one common subset: per round, the claims whose DirK is defined in every
probe, so the systems are compared on the same claims.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from real_fae_core.atomicio import atomic_file, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, only_names
from fae.probes.dirk import bootstrap_ci
from fae.probes.knowledge import shares_text

CLAIMS_FILE = "dirk_claims.jsonl"
DEFAULT_TITLE = "Directional alignment to knowledge-based state"


@dataclasses.dataclass
class ProbeReportConfig(CommandConfig):
    """`fae probe-report`: the DirK figure and tables of one or more `fae probe` outputs."""

    dirs: list[str] = option(positional=True, metavar="DIR", help="output directories of `fae probe`")
    output: str = option(help="directory for dirk.png and dirk.md")
    names: list[str] | None = option(None, deprecated=("--labels",), help="one name per DIR, shown in the legend "
                                     "and tables (default: the directory names)")
    title: str = DEFAULT_TITLE


def load_probe(d: str | Path) -> dict:
    """The dirk.json of a `fae probe` output directory; missing, not JSON or lacking a round's field is one
    :class:`UserError` naming the file."""
    path = Path(d) / "dirk.json"
    if not path.is_file():
        raise UserError(f"{path}: not found (run `fae probe --output {d}` first)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("rounds"), list):
        raise UserError(f"{path}: field 'rounds': missing (not a `fae probe` output)")
    for k, r in enumerate(obj["rounds"]):
        for key in ("round", "mean", "ci_low", "ci_high", "n"):
            if key not in r:
                raise UserError(f"{path}: field 'rounds[{k}].{key}': missing")
    return obj


def _cell(r: dict | None) -> str:
    if r is None or r["mean"] is None:
        return "–"
    if r["ci_low"] is None:
        return f"{r['mean']:.3f} (n={r['n']})"
    return f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def markdown_table(labels: list[str], probes: list[dict]) -> str:
    """DirK per round, one column per probe (mean [CI]), with each probe's claims, layer and reference rows."""
    rounds = sorted({r["round"] for p in probes for r in p["rounds"]})
    by = [{r["round"]: r for r in p["rounds"]} for p in probes]
    lines = [
        "| round | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for rd in rounds:
        lines.append(f"| {rd} | " + " | ".join(_cell(b.get(rd)) for b in by) + " |")
    lines.append("| n claims | " + " | ".join(str(p.get("n_claims", "?")) for p in probes) + " |")
    lines.append("| layer | " + " | ".join(str(p.get("layer", "?")) for p in probes) + " |")
    lines.append("| h(K) from | " + " | ".join(p.get("knowledge_reference", "verifier") for p in probes) + " |")
    lines.append("| claim-only answers (verifier) | "
                 + " | ".join(shares_text((p.get("knowledge_answers") or {}).get("verifier")) for p in probes) + " |")
    if any((p.get("knowledge_answers") or {}).get("reference") for p in probes):
        lines.append("| claim-only answers (base, h(K)) | "
                     + " | ".join(shares_text((p.get("knowledge_answers") or {}).get("reference")) for p in probes)
                     + " |")
    lines.append("| abstaining reference | " + " | ".join(_flag(p, "abstaining_reference") for p in probes) + " |")
    lines.append("| invalid reference | " + " | ".join(_flag(p, "invalid_reference") for p in probes) + " |")
    return "\n".join(lines) + "\n"


def _flag(probe: dict, key: str) -> str:
    if key not in probe:
        return "unknown (probe without claim-only answers)" if "knowledge_answers" not in probe else "–"
    return "**yes**" if probe[key] else "no"


def load_claim_values(d: str | Path) -> dict[str, list]:
    """Per claim id, its DirK value per round (None = undefined), from a probe's dirk_claims.jsonl."""
    path = Path(d) / CLAIMS_FILE
    if not path.is_file():
        raise UserError(f"{path}: not found (run `fae probe --output {d}` first)")
    out = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            out[str(row["id"])] = list(row["dirk"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}:{n}: not a `fae probe` claim line (fields 'id', 'dirk')") from None
    return out


def common_subset_rounds(values: list[dict[str, list]], *, n_resamples: int, seed: int | None) -> list[dict]:
    """Per round r >= 1: the claims whose DirK is defined in every probe, and each probe's mean and 95%
    bootstrap CI on exactly those claims (so a system is never read on claims another one lacks)."""
    ids = sorted(set.intersection(*(set(v) for v in values)))
    n_rounds = max((len(v[i]) for v in values for i in ids), default=1) - 1
    out = []
    for r in range(1, n_rounds + 1):
        common = [i for i in ids if all(r < len(v[i]) and v[i][r] is not None for v in values)]
        cells = [bootstrap_ci([v[i][r] for i in common], n_resamples=n_resamples,
                              seed=None if seed is None else seed + r) for v in values]
        out.append({"round": r, "n": len(common), "cells": cells})
    return out


def common_subset_table(labels: list[str], rounds: list[dict]) -> str:
    """DirK per round over the claims defined in every probe (``rounds`` from :func:`common_subset_rounds`)."""
    lines = ["| round | n (common) | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['n']} | " + " | ".join(_cell(c) for c in r["cells"]) + " |")
    return "\n".join(lines) + "\n"


def reference_notes(labels: list[str], probes: list[dict]) -> list[str]:
    """One line per checkpoint whose h(K) is an abstention state."""
    return [f"- **{label}**: {p['reference_note']}" for label, p in zip(labels, probes) if p.get("reference_note")]


def plot(labels: list[str], probes: list[dict], path: Path, title: str) -> None:
    """DirK per round with its 95% CI band, one line per probe, as a PNG at ``path`` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, p in zip(labels, probes):
        pts = [r for r in p["rounds"] if r["mean"] is not None]
        if not pts:
            continue
        x = [r["round"] for r in pts]
        line, = ax.plot(x, [r["mean"] for r in pts], marker="o", label=label)
        band = [r for r in pts if r["ci_low"] is not None]
        if band:
            ax.fill_between([r["round"] for r in band], [r["ci_low"] for r in band],
                            [r["ci_high"] for r in band], color=line.get_color(), alpha=0.2,
                            linewidth=0)
    rounds = sorted({r["round"] for p in probes for r in p["rounds"]})
    if rounds:
        ax.set_xticks(rounds)
    ax.set_xlabel("ablation round r")
    ax.set_ylabel(r"DirK$^{(r)}$ (mean, 95% CI)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no defined DirK values\n(every pool unchanged)",
                transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=150)
    plt.close(fig)


def run(config: ProbeReportConfig) -> CommandResult:
    """`fae probe-report` as a function: dirk.png, dirk.md (and, for several probes, dirk_common.json) in
    ``config.output``; probes of different layers or references are compared with a warning."""
    labels = config.names or [Path(d).resolve().name for d in config.dirs]
    if len(labels) != len(config.dirs):
        raise UserError(f"--names has {len(labels)} names for {len(config.dirs)} directories")
    guard = claim_dir(config.output, "fae probe-report", inputs=config.dirs,
                      legacy=only_names("dirk.png", "dirk.md", "dirk_common.json"))
    probes = [load_probe(d) for d in config.dirs]
    layers = {p.get("layer") for p in probes}
    out = Path(config.output)
    guard.mark()
    plot(labels, probes, out / "dirk.png", config.title)
    outputs = {"plot": str(out / "dirk.png"), "report": str(out / "dirk.md")}
    md = "# DirK per round: mean [95% bootstrap CI]\n\n" + markdown_table(labels, probes)
    if len(layers) > 1:
        md += "\nWarning: the probes use different layers, so their values are not comparable.\n"
    if len({p.get("knowledge_reference", "verifier") for p in probes}) > 1:
        md += ("\nWarning: h(K) comes from the verifier in some probes and from the base model in others: "
               "their DirK values measure drift toward different states.\n")
    common = None
    if len(probes) > 1:
        boot = probes[0].get("bootstrap") or {}
        common = common_subset_rounds([load_claim_values(d) for d in config.dirs],
                                      n_resamples=boot.get("n_resamples", 2000), seed=boot.get("seed", 0))
        md += ("\n## On one common subset\n\nPer round, only the claims whose DirK is defined in every probe "
               "(the pool changed and the state moved for all systems), so every column reads the same claims:\n\n"
               + common_subset_table(labels, common))
        atomic_write_text(out / "dirk_common.json", json.dumps({"labels": labels, "rounds": common}, indent=2) + "\n")
        outputs["common"] = str(out / "dirk_common.json")
    notes = reference_notes(labels, probes)
    if notes:
        md += "\nWhat DirK measures here:\n\n" + "\n".join(notes) + "\n"
    atomic_write_text(out / "dirk.md", md)
    print(md, end="")
    print(f"fae probe-report: wrote {out / 'dirk.png'} and {out / 'dirk.md'}")
    summary = {"labels": labels, "rounds": [p["rounds"] for p in probes], "common_subset": common}
    return CommandResult(outputs=outputs, summary=summary)
