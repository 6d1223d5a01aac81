"""`fae neurons`: MLP neuron overlap of evidence- vs knowledge-based prompts (SPEC §7).

A neuron is one input channel of a layer's ``mlp.down_proj``, i.e. one entry
of ``act_fn(gate_proj(x)) * up_proj(x)``. Over the prompt tokens of a
calibration set (padding masked out), each paradigm accumulates the sum of
``|activation|`` per neuron and the token count in float64 running sums, so
memory does not grow with the number of claims. Neurons are ranked by mean
absolute activation; a paradigm's set is the smallest top-k set whose
cumulative share of the total reaches ``--coverage`` (ties: lower index
first).

Two scopes are reported:

- per layer: ranking and total within each layer;
- overall: one global ranking over all neurons of all layers, with the
  total summed over all layers (the paper's single Venn diagram). The sum of
  the per-layer sets is reported too (``per_layer_sum``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from data_prep.core.errors import UserError
from data_prep.prompts import (
    encode_chat,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import NOT_ENOUGH_INFO, ClaimRecord, RecordError, iter_records

PARADIGMS = ("evidence", "knowledge")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", required=True, help="calibration records JSONL (e.g. eval.jsonl)")
    p.add_argument("--model", required=True, help="base model directory (HF format)")
    p.add_argument("--adapter", default=None, help="optional PEFT/LoRA adapter directory")
    p.add_argument("--output", required=True, help="directory for neurons.json/.md/_venn.png")
    p.add_argument("--coverage", type=float, default=0.9,
                   help="share of the total |activation| the kept set must reach (default 0.9)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N usable records")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass (default 8)")
    p.add_argument("--include-nei", action="store_true",
                   help="also use NOT_ENOUGH_INFO records (excluded by default, as in FAE)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    p.add_argument("--dtype", default="auto",
                   help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16 or float16")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code")


# ---------------------------------------------------------------------------
# Pure logic
# ---------------------------------------------------------------------------

def coverage_set(scores: np.ndarray, coverage: float) -> np.ndarray:
    """Boolean mask of the smallest top-k set whose share of the total reaches ``coverage``.

    Ranking is by score, descending; ties keep the lower index first. An
    all-zero score vector gives an empty set.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if np.any(scores < 0) or not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite and non-negative")
    mask = np.zeros(scores.shape, dtype=bool)
    total = scores.sum()
    if total <= 0:
        return mask
    order = np.argsort(-scores, kind="stable")
    cum = np.cumsum(scores[order])
    k = int(np.searchsorted(cum, coverage * total, side="left")) + 1
    mask[order[: min(k, scores.size)]] = True
    return mask


def overlap_stats(a: np.ndarray, b: np.ndarray) -> dict:
    """Sizes, intersection, Jaccard and overlap relative to each set (a = evidence)."""
    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    na, nb = int(a.sum()), int(b.sum())
    inter = int((a & b).sum())
    union = int((a | b).sum())

    def ratio(x, y):
        return None if y == 0 else x / y

    return {
        "n_neurons": int(a.size),
        "evidence_size": na,
        "knowledge_size": nb,
        "intersection": inter,
        "union": union,
        "evidence_only": na - inter,
        "knowledge_only": nb - inter,
        "jaccard": ratio(inter, union),
        "overlap_of_evidence": ratio(inter, na),
        "overlap_of_knowledge": ratio(inter, nb),
    }


# ---------------------------------------------------------------------------
# Streaming activation statistics
# ---------------------------------------------------------------------------

def find_down_projs(model) -> list[tuple[int, str, object]]:
    """``(layer, name, module)`` for each ``down_proj``, by name suffix (works under PEFT)."""
    found = []
    for name, mod in model.named_modules():
        if name.split(".")[-1] != "down_proj":
            continue
        m = _LAYER_RE.search(name)
        found.append((int(m.group(1)) if m else len(found), name, mod))
    if not found:
        raise UserError("no MLP down_proj modules found in this model")
    found.sort(key=lambda t: t[0])
    return found


class ActivationAccumulator:
    """Per-paradigm float64 running sums of |down_proj input| and token counts.

    State is ``[n_layers, intermediate]`` per paradigm, whatever the number
    of prompts. Use :meth:`add` once per batch.
    """

    def __init__(self, model):
        import torch

        self.model = model
        self.modules = find_down_projs(model)
        self.layers = [layer for layer, _, _ in self.modules]
        self.sums: dict[str, list] = {}
        self.tokens = {p: 0 for p in PARADIGMS}
        self._mask = None
        self._paradigm = None
        self._handles = []
        dev = next(model.parameters()).device
        for p in PARADIGMS:
            self.sums[p] = [torch.zeros(mod.in_features, dtype=torch.float64, device=dev)
                            for _, _, mod in self.modules]
        for k, (_, _, mod) in enumerate(self.modules):
            self._handles.append(mod.register_forward_pre_hook(self._hook(k)))

    def _hook(self, k: int):
        import torch

        def hook(module, args):
            if self._paradigm is None:
                return None
            x = args[0]
            sel = x[self._mask]  # [real tokens, intermediate]; padding dropped
            self.sums[self._paradigm][k] += sel.abs().sum(0, dtype=torch.float64)
            return None

        return hook

    def add(self, paradigm: str, token_seqs, pad_id: int) -> None:
        import torch

        from fae.probes.hidden import left_pad_batch

        dev = next(self.model.parameters()).device
        enc = left_pad_batch(token_seqs, pad_id, dev)
        self._mask = enc["attention_mask"].bool()
        self._paradigm = paradigm
        try:
            with torch.no_grad():
                self.model(**enc, use_cache=False, logits_to_keep=1)
        finally:
            self._paradigm = None
            self._mask = None
        self.tokens[paradigm] += int(enc["attention_mask"].sum())

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def mean_abs(self, paradigm: str) -> np.ndarray:
        """``[n_layers, intermediate]`` mean |activation| per prompt token."""
        n = max(self.tokens[paradigm], 1)
        return np.stack([s.cpu().numpy() for s in self.sums[paradigm]]) / n


def _batched(it: Iterable, n: int) -> Iterator[list]:
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf


def accumulate(model, tokenizer, records: Iterable[ClaimRecord], *, batch_size: int = 8,
               progress: bool = False, total: int | None = None) -> ActivationAccumulator:
    """Stream records through the model under both paradigms (full pool vs claim only)."""
    acc = ActivationAccumulator(model)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="fae neurons", unit="claim")
    try:
        for batch in _batched(records, batch_size):
            ev = [encode_chat(tokenizer, render_evidence_prompt(r)) for r in batch]
            kn = [encode_chat(tokenizer, render_knowledge_prompt(r)) for r in batch]
            acc.add("evidence", ev, tokenizer.pad_token_id)
            acc.add("knowledge", kn, tokenizer.pad_token_id)
            if bar is not None:
                bar.update(len(batch))
    finally:
        acc.close()
        if bar is not None:
            bar.close()
    return acc


def analyse(mean_ev: np.ndarray, mean_kn: np.ndarray, layers: list[int], coverage: float) -> dict:
    """Per-layer, overall (global ranking) and per-layer-sum overlap statistics."""
    per_layer = []
    masks = {"evidence": [], "knowledge": []}
    for k, layer in enumerate(layers):
        a = coverage_set(mean_ev[k], coverage)
        b = coverage_set(mean_kn[k], coverage)
        masks["evidence"].append(a)
        masks["knowledge"].append(b)
        per_layer.append({"layer": layer, **overlap_stats(a, b)})
    ga = coverage_set(mean_ev.reshape(-1), coverage).reshape(mean_ev.shape)
    gb = coverage_set(mean_kn.reshape(-1), coverage).reshape(mean_kn.shape)
    overall = overlap_stats(ga, gb)
    overall["per_layer_evidence_size"] = [int(x) for x in ga.sum(1)]
    overall["per_layer_knowledge_size"] = [int(x) for x in gb.sum(1)]
    pla, plb = np.stack(masks["evidence"]), np.stack(masks["knowledge"])
    return {
        "per_layer": per_layer,
        "overall": overall,
        "per_layer_sum": overlap_stats(pla, plb),
        "_masks": {"global_evidence": ga, "global_knowledge": gb,
                   "layer_evidence": pla, "layer_knowledge": plb},
    }


# ---------------------------------------------------------------------------
# Venn figure (two circles, area-proportional)
# ---------------------------------------------------------------------------

def lens_area(r1: float, r2: float, d: float) -> float:
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
    fig.savefig(path, dpi=150)
    plt.close(fig)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def markdown(result: dict, meta: dict) -> str:
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


def _usable(path: str, include_nei: bool, limit: int | None) -> Iterator[ClaimRecord]:
    n = 0
    for rec in iter_records(path):
        if rec.label == NOT_ENOUGH_INFO and not include_nei:
            continue
        yield rec
        n += 1
        if limit is not None and n >= limit:
            return


def run(args: argparse.Namespace) -> int:
    if not 0.0 < args.coverage <= 1.0:
        raise UserError(f"--coverage must be in (0, 1], got {args.coverage}")
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    if not Path(args.records).is_file():
        raise UserError(f"--records {args.records!r}: file not found")
    from data_prep.core.runlock import RunLock

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    with RunLock(out, "fae neurons", is_dir=True):  # one writer for the command's lifetime
        return _neurons(args, out)


def _neurons(args: argparse.Namespace, out: Path) -> int:
    from fae.backends.hf import load_hf_model

    model, tok = load_hf_model(args.model, args.adapter, device=args.device, dtype=args.dtype,
                               trust_remote_code=args.trust_remote_code)
    counter = {"n": 0}

    def counted():
        for rec in _usable(args.records, args.include_nei, args.limit):
            counter["n"] += 1
            yield rec

    try:
        acc = accumulate(model, tok, counted(), batch_size=args.batch_size, progress=True,
                         total=args.limit)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    if counter["n"] == 0:
        raise UserError(f"{args.records}: no usable records (NOT_ENOUGH_INFO ones are skipped "
                        f"unless --include-nei)")
    mean_ev, mean_kn = acc.mean_abs("evidence"), acc.mean_abs("knowledge")
    result = analyse(mean_ev, mean_kn, acc.layers, args.coverage)
    masks = result.pop("_masks")

    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "model": str(args.model),
        "adapter": None if args.adapter is None else str(args.adapter),
        "records": str(args.records),
        "n_claims": counter["n"],
        "coverage": args.coverage,
        "tokens": dict(acc.tokens),
        "modules": [name for _, name, _ in acc.modules],
        "score": "mean |input of mlp.down_proj| over all prompt tokens (padding excluded)",
        "overall_scope": "one ranking and one total over all neurons of all layers",
    }
    (out / "neurons.json").write_text(json.dumps({**meta, **result}, indent=2) + "\n",
                                      encoding="utf-8")
    import torch
    from safetensors.torch import save_file

    tensors = {
        "mean_abs_evidence": torch.from_numpy(mean_ev.astype(np.float32)),
        "mean_abs_knowledge": torch.from_numpy(mean_kn.astype(np.float32)),
    }
    tensors.update({f"set_{k}": torch.from_numpy(v.astype(np.uint8)) for k, v in masks.items()})
    save_file(tensors, str(out / "neuron_stats.safetensors"),
              metadata={"layers": json.dumps(acc.layers), "coverage": str(args.coverage)})
    plot_venn(result["overall"], out / "neurons_venn.png",
              f"Neurons covering {args.coverage:.0%} of |activation|")
    md = markdown(result, meta)
    (out / "neurons.md").write_text(md, encoding="utf-8")
    print(md, end="")
    print(f"fae neurons: wrote {out / 'neurons.json'}, neurons.md, neurons_venn.png")
    return 0
