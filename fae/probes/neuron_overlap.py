"""Neuron sets and their overlap (pure): the smallest top-k set covering a share of the
total |activation|, and the overlap of the evidence and knowledge sets per layer and overall.

Ranking is by mean absolute activation; ties keep the lower index first. The
overall scope is one global ranking over all neurons of all layers (the
paper's single Venn diagram); the sum of the per-layer sets is reported too.
"""

from __future__ import annotations

import numpy as np


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
