"""Helpers for the FAE tests: real Check-COVID records, hand-built run claims and runs, a scripted verifier."""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_prep.converters import CONVERTERS, ConvertInputs, ConvertStats
from helpers import make_record_dict

from data_prep.records import ClaimRecord, save_records


def checkcovid_records(shared_data: Path, n: int = 20, split: str = "covidCheck_test_composed.json"):
    """The first ``n`` SUPPORT/REFUTE claims of a Check-COVID split of the shared data as ClaimRecords."""
    return convert_checkcovid(Path(shared_data) / "check-covid", n, split)


def convert_checkcovid(data_dir: Path, n: int, claims_file: str) -> list:
    """The first ``n`` records `real-data convert --dataset check-covid` makes of ``data_dir/claims_file``.

    The converter itself reads them (pool = the abstract of the claim's ``cord_id``, gold = one group of its
    ``sent_index`` values; NOT_ENOUGH_INFO claims dropped), so tests and benchmarks see what users get.
    """
    inputs = ConvertInputs(claims=[Path(data_dir) / claims_file], corpus=Path(data_dir) / "corpus.json")
    out = []
    for rec, _, _ in CONVERTERS["check-covid"].convert(inputs, ConvertStats()):
        out.append(rec.validate())
        if len(out) == n:
            break
    return out


def write_checkcovid(shared_data: Path, path: Path, n: int = 20) -> Path:
    save_records(checkcovid_records(shared_data, n), path)
    return path


def seal_run(run_dir: Path, *, metrics: dict | None = None) -> Path:
    """Make a hand-built run directory a finished run as `fae run` leaves it.

    config.json gains the claim set (the ids of claims.jsonl, in file order) and,
    when ``metrics`` is given, metrics.json records the claims.jsonl it describes.
    """
    from fae.ablation import runio

    run_dir = Path(run_dir)
    claims = runio.read_claims(run_dir / runio.CLAIMS)
    cpath = run_dir / runio.CONFIG
    config = json.loads(cpath.read_text(encoding="utf-8")) if cpath.is_file() else {}
    config.update(runio.claim_set([str(c["id"]) for c in claims]))
    runio.write_json_atomic(cpath, config)
    if metrics is not None:
        runio.write_json_atomic(run_dir / runio.METRICS,
                                runio.stamp_metrics(metrics, run_dir / runio.CLAIMS, len(claims)))
    return run_dir


# ---------------------------------------------------------------- hand-built claims.jsonl rows

NEI = "NOT_ENOUGH_INFO"


def rnd(r, pool, label, cited=(), halluc=(), reused=False, evidence=None):
    valid = label is not None
    return {"round": r, "pool_ids": list(pool), "raw_output": "", "label": label,
            "cited": list(cited) if valid else [], "hallucinated": list(halluc) if valid else [],
            "valid": valid, "reused": reused,
            **({"evidence": evidence} if evidence is not None else {})}


def claim(cid, gold, groups, rounds):
    return {"id": cid, "gold_label": gold, "gold_groups": groups, "rounds": rounds}


def ideal_claims(R=4):
    out = []
    for k, (gold, groups, pool) in enumerate([("SUPPORT", [[1]], [0, 1, 2]), ("REFUTE", [[0, 2]], [0, 1, 2, 3]),
                                               ("SUPPORT", [[4], [5]], [3, 4, 5])]):
        cited = sorted({i for g in groups for i in g})
        rest = [i for i in pool if i not in cited]
        rounds = [rnd(0, pool, gold, cited)] + [rnd(r, rest, NEI, reused=r > 1) for r in range(1, R + 1)]
        out.append(claim(f"i{k}", gold, groups, rounds))
    return out


def mixed_claims():
    return [
        # E* = {0, 3}; cites 0 (gold) and 1; then 3; then abstains
        claim("A", "SUPPORT", [[0], [3]], [
            rnd(0, [0, 1, 2, 3], "SUPPORT", [0, 1]),
            rnd(1, [2, 3], "SUPPORT", [3]),
            rnd(2, [2], NEI)]),
        # invents id 7; flips REFUTE -> SUPPORT -> REFUTE; cites an ablated id at r2
        claim("B", "REFUTE", [[1, 2]], [
            rnd(0, [0, 1, 2], "REFUTE", [1], [7], evidence=[7, 1]),
            rnd(1, [0, 2], "SUPPORT", [2]),
            rnd(2, [0], "REFUTE", [], [2])]),
        # invalid throughout (reused)
        claim("C", "SUPPORT", [[0]], [
            rnd(0, [0, 1], None), rnd(1, [0, 1], None, reused=True), rnd(2, [0, 1], None, reused=True)]),
        # right label, wrong evidence
        claim("D", "REFUTE", [[1]], [
            rnd(0, [0, 1], "REFUTE", [0]), rnd(1, [1], "REFUTE", [1]), rnd(2, [], NEI)]),
    ]


# ---------------------------------------------------------------- two hand-built runs for `fae compare`

# id, gold, groups, (label, cited) per round for system A, then for system B
CLAIMS = [
    ("c1", "SUPPORT", [[0]], [("SUPPORT", [0]), ("SUPPORT", [1]), ("NOT_ENOUGH_INFO", [])],
     [("SUPPORT", [0]), ("NOT_ENOUGH_INFO", []), ("NOT_ENOUGH_INFO", [])]),
    ("c2", "REFUTE", [[2, 3]], [("REFUTE", [5]), ("REFUTE", []), ("SUPPORT", [])],
     [("SUPPORT", [2]), ("NOT_ENOUGH_INFO", []), ("NOT_ENOUGH_INFO", [])]),
    ("c3", "SUPPORT", [[1]], [(None, []), ("SUPPORT", [1]), ("SUPPORT", [4])],
     [("SUPPORT", [1]), ("NOT_ENOUGH_INFO", []), ("NOT_ENOUGH_INFO", [])]),
    ("c4", "REFUTE", [[0]], [("SUPPORT", [0]), ("REFUTE", []), ("REFUTE", [])],
     [("REFUTE", [3]), ("REFUTE", [0]), ("NOT_ENOUGH_INFO", [])]),
]


def write_run(path: Path, which: int, claims=CLAIMS, sha="abc123" * 10, rounds=2) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with (path / "claims.jsonl").open("w") as fh:
        for cid, gold, groups, ra, rb in claims:
            answers = ra if which == 0 else rb
            rec = {"id": cid, "gold_label": gold, "gold_groups": groups, "rounds": [
                {"round": r, "pool_ids": [0, 1, 2, 3, 4, 5], "raw_output": "...", "label": lab, "cited": cited,
                 "hallucinated": [], "valid": lab is not None, "reused": False}
                for r, (lab, cited) in enumerate(answers[: rounds + 1])
            ]}
            fh.write(json.dumps(rec) + "\n")
    (path / "config.json").write_text(json.dumps({
        "records": "eval.jsonl", "records_sha256": sha, "model": f"tiny-{'sft' if which == 0 else 'real'}",
        "adapter": None, "rounds": rounds}))
    return seal_run(path, metrics={"n_claims": len(claims), "rounds": rounds})


# ---------------------------------------------------------------- a scripted verifier for the ablation loop

def rec(rid, n=4, label="SUPPORT", groups=((0,),)):
    return ClaimRecord.from_dict(make_record_dict(
        id=rid, label=label, sentences=[{"id": i, "text": f"sentence {i}"} for i in range(n)],
        evidence=[list(g) for g in groups]))


def shown_ids(messages):
    return [int(i) for i in re.findall(r"^line(\d+):", messages[-1]["content"], re.M)]


class Scripted:
    """A deterministic verifier: cites the lowest line shown, NEI on an empty pool."""

    def __init__(self, script=None):
        self.calls = []
        self.script = script or {}

    def __call__(self, prompts, callback=None):
        out = []
        for m in prompts:
            ids = shown_ids(m)
            self.calls.append(ids)
            claim = re.search(r"^Claim: (.*)$", m[-1]["content"], re.M).group(1)
            if claim in self.script:
                out.append(self.script[claim](ids))
            elif ids:
                out.append(json.dumps({"label": "SUPPORT", "evidence": [ids[0]]}))
            else:
                out.append(json.dumps({"label": "NOT_ENOUGH_INFO", "evidence": []}))
        if callback:
            callback(len(prompts))
        return out
