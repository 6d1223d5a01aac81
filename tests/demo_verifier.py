"""The demo's shipped base model as the verifier of the equivalence tests (shards, Ray, Inspect).

A random tiny Llama answers invalid JSON at round 0, so FAE reuses every later round and two paths agree
without asking a single ablated pool. The demo base (``real/demo/base``, a word-level Llama trained on the
demo world) answers the demo's JSON and cites the line it read, so the ablation really runs:

- records: demo-world claims (``real.demo.world``) whose proving line appears ``copies`` times in the
  pool (``add_incomplete_gold`` applied ``copies - 1`` times with share 1): after a round removes one copy,
  the next round still finds another, so a claim's rounds 1, 2, ... ask new pools;
- ``--line-ids renumbered``: the base learned that a hole in the line numbering means the gold line is
  gone (its missing-gold training pools had one) and then cites nothing, which would stop every claim
  after round 1; renumbered pools show no hole;
- fp32 (the demo's dtype) and greedy decoding on every path.

:func:`generated_calls` counts what a run asked the model after round 0, per arm, from claims.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.records import save_records
from real.demo.pipeline import BASE_DIR, DEMO_DTYPE
from real.demo.world import add_incomplete_gold, build_world, make_split, train_test_facts

MODEL = BASE_DIR
DTYPE = DEMO_DTYPE  # fae run --dtype fp32; Inspect's hf provider: -M dtype=float32
INSPECT_DTYPE = "float32"
MAX_NEW_TOKENS = 16  # the demo's answers ({"label": "REFUTE", "evidence": [3]}) take about 10 word tokens
LINE_IDS = "renumbered"


def write_records(path: Path, n: int, copies: int = 3, seed: int = 0) -> Path:
    """``n`` demo-world test claims (SUPPORT/REFUTE), each pool holding ``copies`` copies of its proving line."""
    world = build_world(seed=seed)
    _, facts = train_test_facts(world, 0, n, seed=seed + 10)
    records = make_split(world, facts, seed=seed + 12, prefix="demo-test")
    for k in range(copies - 1):
        add_incomplete_gold(records, seed=f"equivalence-{seed}-{k}", share=1.0)
    save_records(records, path)
    return path


def fae_run_args(records: Path, out: Path, *extra: str, rounds: int = 4) -> list[str]:
    """`fae run` with the demo base on hf: fp32, greedy, renumbered line ids, default arms."""
    return ["run", "--backend", "hf", "--model", str(MODEL), "--device", "cpu", "--records", str(records),
            "--output", str(out), "--rounds", str(rounds), "--max-new-tokens", str(MAX_NEW_TOKENS),
            "--dtype", DTYPE, "--line-ids", LINE_IDS, "--no-label-probs", "--no-progress", *extra]


def read_claims(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "claims.jsonl").read_text().splitlines()]


def generated_calls(claims: list[dict]) -> dict[str, int]:
    """Model calls after round 0 that were generated, not copied: ``ablation`` (rounds >= 1 of the
    ablation arm) and ``control`` (control pools asked, not reused or skipped)."""
    return {
        "claims": len(claims),
        "ablation": sum(1 for c in claims for r in c["rounds"] if r["round"] >= 1 and not r.get("reused")),
        "control": sum(1 for c in claims for r in c.get("control") or ()
                       if "skipped" not in r and not r.get("reused")),
    }


def assert_ablated_rounds_generated(claims: list[dict], per_claim: float = 2.0,
                                    control_per_claim: float = 1.0) -> dict[str, int]:
    """The run asked the model at least ``per_claim`` ablated pools per claim on average (ablation arm,
    rounds >= 1) and ``control_per_claim`` control pools; returns the counts."""
    n = generated_calls(claims)
    assert n["claims"] and n["ablation"] >= per_claim * n["claims"], n
    assert n["control"] >= control_per_claim * n["claims"], n
    return n
