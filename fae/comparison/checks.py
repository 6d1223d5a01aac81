"""The two runs `fae compare` reads, and the checks that they are comparable.

:func:`load_compared` reads a finished run and refuses a claim without the fields the accounting needs.
Two runs are compared only when they cover the same claims of the same records file
(:func:`check_same_claims`), numbered their pool lines the same way (:func:`check_same_line_ids`), ran in
the same dtype (:func:`check_same_dtype`) and decoded both free or both held to the schema
(:func:`check_same_decoding`); the last three may be overridden, and the first two then give the warning
the outputs carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from real_fae_core.errors import UserError
from fae.ablation.runio import CLAIMS, RUN_FINGERPRINT, RunData, load_run


@dataclass
class Run:
    path: Path
    config: dict
    metrics: dict
    claims: dict[str, dict]  # id -> claims.jsonl entry
    order: list[str]


def _check_claim(data: RunData, obj: dict) -> None:
    """Refuse a claim without the fields the accounting needs, naming its line and field."""
    def fail(field, reason):
        raise data.claim_error(obj, field, reason)

    cid = obj.get("id")
    if not isinstance(cid, str) or not cid:
        fail("id", "missing or not a non-empty string")
    if not isinstance(obj.get("gold_label"), str):
        fail("gold_label", "missing or not a string")
    groups = obj.get("gold_groups")
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(i, int) for i in g)
                                               for g in groups):
        fail("gold_groups", "must be a list of lists of sentence ids")
    rounds = obj.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        fail("rounds", "missing or empty")
    for k, r in enumerate(rounds):
        if not isinstance(r, dict):
            fail(f"rounds[{k}]", "not an object")
        if r.get("round", k) != k:
            fail(f"rounds[{k}].round", f"expected {k}, got {r.get('round')!r}")
        if r.get("label") is not None and not isinstance(r.get("label"), str):
            fail(f"rounds[{k}].label", "must be a label string or null")
        for key in ("cited", "hallucinated", "evidence"):
            ids = r.get(key) or []
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                fail(f"rounds[{k}].{key}", "must be a list of sentence ids")


def load_compared(path: str | Path) -> Run:
    """Read a finished FAE run through :func:`fae.ablation.runio.load_run` (refuses unfinished or
    inconsistent runs), then check every claim has the fields the accounting needs."""
    data = load_run(path)
    if not data.claims:
        raise UserError(f"{data.path / CLAIMS}: no claims")
    claims: dict[str, dict] = {}
    for obj in data.claims:
        _check_claim(data, obj)
        claims[obj["id"]] = obj
    return Run(path=data.path, config=data.config, metrics=data.metrics or {}, claims=claims,
               order=list(claims))


def check_same_claims(a: Run, b: Run) -> list[str]:
    """Fail clearly unless both runs cover the same claims of the same record file; return the claim order."""
    sha_a, sha_b = a.config.get("records_sha256"), b.config.get("records_sha256")
    if sha_a and sha_b and sha_a != sha_b:
        raise UserError(
            f"the runs were made on different record files: {a.path} used {a.config.get('records')} "
            f"(sha256 {sha_a[:12]}...), {b.path} used {b.config.get('records')} (sha256 {sha_b[:12]}...)"
        )
    ids_a, ids_b = set(a.claims), set(b.claims)
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in {a.path} (e.g. {', '.join(map(repr, only_a[:3]))})")
        if only_b:
            parts.append(f"{len(only_b)} only in {b.path} (e.g. {', '.join(map(repr, only_b[:3]))})")
        raise UserError("the runs cover different claims: " + "; ".join(parts))
    for cid in a.order:
        ca, cb = a.claims[cid], b.claims[cid]
        if ca["gold_label"] != cb["gold_label"]:
            raise UserError(f"claim {cid!r} has gold label {ca['gold_label']} in {a.path} "
                            f"but {cb['gold_label']} in {b.path}")
        if sorted(map(sorted, ca["gold_groups"])) != sorted(map(sorted, cb["gold_groups"])):
            raise UserError(f"claim {cid!r} has different gold evidence groups in {a.path} and {b.path}")
    return list(a.order)


def line_ids_of(run: Run) -> str:
    """How the run's prompts numbered the pool lines (SPEC §3); runs made before the choice existed: original."""
    return run.config.get("line_ids") or RUN_FINGERPRINT.defaults["line_ids"]  # a compatibility default


def check_same_line_ids(a: Run, b: Run, allow_mixed: bool) -> str | None:
    """Refuse two runs whose prompts numbered the lines differently, unless allowed: then the warning to carry."""
    la, lb = line_ids_of(a), line_ids_of(b)
    if la == lb:
        return None
    if not allow_mixed:
        raise UserError(f"{a.path} numbered the pool lines {la} and {b.path} {lb} (config.json line_ids): a verifier "
                        "that reads the numbering (a hole where a line went) answers the two differently, so their "
                        "IS, IS_ctrl and accounting are not comparable; rerun one of them, or pass "
                        "--allow-mixed-line-ids to compare anyway")
    return (f"WARNING: mixed line numbering: A ({a.path}) used line_ids {la}, B ({b.path}) {lb}; every difference "
            "B - A mixes the verifiers with the numbering (a hole where a line went shows only under original)")


# Spellings of one dtype across the backends' records (fae run's resolved torch name, a vllm/Inspect arg)
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
# Recorded values that name no dtype: a server's choice, vllm's own resolution, or nothing recorded
UNKNOWN_DTYPES = (None, "", "auto", "server")


def dtype_of(run: Run) -> str | None:
    """The dtype the run's weights ran in (config.json ``decoding.dtype``); None where the run does not know
    it: a server's (``fae run --backend openai``, Inspect's API providers), vllm's ``auto``, an older run."""
    value = (run.config.get("decoding") or {}).get("dtype")
    value = str(value).removeprefix("torch.") if value is not None else None
    return None if value in UNKNOWN_DTYPES else DTYPE_NAMES.get(value, value)


def check_same_dtype(a: Run, b: Run, allow_mixed: bool) -> str | None:
    """Refuse two runs made in different known dtypes, unless allowed: then the warning to carry. A run whose
    dtype is unknown (a server's) is compared as it is: nothing recorded says the two differ."""
    da, db = dtype_of(a), dtype_of(b)
    if da is None or db is None or da == db:
        return None
    if not allow_mixed:
        raise UserError(f"{a.path} ran in {da} and {b.path} in {db} (config.json decoding.dtype): greedy answers "
                        "flip on near ties between dtypes, so the difference would mix the verifiers with the "
                        "arithmetic; rerun one of them (fae run --dtype), or pass --allow-mixed-dtype to compare "
                        "anyway")
    return (f"WARNING: mixed dtypes: A ({a.path}) ran in {da}, B ({b.path}) in {db}; every difference B - A mixes "
            "the verifiers with the dtype (greedy answers flip on near ties)")


def check_same_decoding(a: Run, b: Run, allow_mixed: bool) -> None:
    """Refuse a constrained vs unconstrained comparison (docs/structured.md) unless allowed."""
    ca, cb = bool(a.config.get("constrained_decoding")), bool(b.config.get("constrained_decoding"))
    if ca != cb and not allow_mixed:
        on, off = (a, b) if ca else (b, a)
        raise UserError(f"{on.path} was run with --constrained-decoding and {off.path} without: answers held "
                        "to a schema are not comparable with free answers; rerun one of them, or pass "
                        "--allow-mixed-decoding to compare anyway")
