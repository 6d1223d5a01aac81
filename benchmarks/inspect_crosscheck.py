"""Cross-check: the same verifier through `fae run` and through `inspect eval real_fae/fae`.

The same model directory, the same records, greedy decoding and the same answer cap on both
sides; then, round by round, how often the two agree on the raw answer text (the strongest
check), on the parsed label and cited ids, and the metrics side by side. Every difference is
listed with its claim and round. docs/inspect.md discusses the result
(benchmarks/results/inspect_crosscheck_tuned.json).

    python benchmarks/inspect_crosscheck.py --model MODEL_DIR --claims covidCheck_test_composed.json \\
        --corpus corpus.json --work /tmp/crosscheck --limit 30 --rounds 4 --max-new-tokens 64

Both sides run offline on the CPU (HF_HUB_OFFLINE=1). `fae run` uses ``--backend hf``; Inspect
uses its ``hf/`` provider on the same directory with ``do_sample=false`` (Inspect's provider
samples unless told not to) and the task's ``temperature 0``. Both load the weights in ``--dtype``
(default float32): greedy answers differ between dtypes on near ties, and ``fae run --dtype auto``
is bf16 on a CPU with native bf16 where Inspect's provider loads what transformers chooses.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from fae.ablation.runio import load_run

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
METRICS = ("label_accuracy", "strict_accuracy", "fever_score", "IS", "ER", "IO", "round_accuracy",
           "invalid_rate", "nei_answer_rate", "model_calls", "reused_calls")


def sh(cmd: list[str], env: dict, log: Path) -> float:
    """Run ``cmd`` (its output into ``log``); the wall seconds it took. A failure stops the benchmark."""
    print("+", shlex.join(cmd), file=sys.stderr, flush=True)
    t = time.time()
    with log.open("w") as fh:
        r = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {shlex.join(cmd)}; see {log}")
    return round(time.time() - t, 1)


def anonymous(value, work: Path, model: str) -> str:
    """A command (list) or setting as text with this machine's paths named WORK and MODEL."""
    text = " ".join(value) if isinstance(value, list) else json.dumps(value)
    return text.replace(str(work), "WORK").replace(model, "MODEL")


def compare(a: list[dict], b: list[dict]) -> dict:
    """Round-by-round agreement of two runs' claims (same ids, same order)."""
    ids_a, ids_b = [c["id"] for c in a], [c["id"] for c in b]
    if ids_a != ids_b:
        raise SystemExit(f"the runs hold different claims: {ids_a[:3]}... vs {ids_b[:3]}...")
    n = same_raw = same_parsed = same_pool = same_reused = model_rounds = same_raw_model = 0
    ablated_model = same_raw_ablated = 0
    diffs = []
    for ca, cb in zip(a, b):
        for ra, rb in zip(ca["rounds"], cb["rounds"]):
            n += 1
            same_pool += ra["pool_ids"] == rb["pool_ids"]
            same_reused += ra["reused"] == rb["reused"]
            raw = ra["raw_output"] == rb["raw_output"]
            parsed = (ra["label"], ra["cited"], ra["hallucinated"], ra["valid"]) == \
                     (rb["label"], rb["cited"], rb["hallucinated"], rb["valid"])
            same_raw += raw
            same_parsed += parsed
            model_rounds += not ra["reused"]
            same_raw_model += raw and not ra["reused"]
            ablated = ra["round"] >= 1 and not ra["reused"]  # a generated answer on a pool that lost lines
            ablated_model += ablated
            same_raw_ablated += raw and ablated
            if not raw:
                diffs.append({"claim": ca["id"], "round": ra["round"], "same_pool": ra["pool_ids"] == rb["pool_ids"],
                              "fae_run": ra["raw_output"], "inspect": rb["raw_output"],
                              "same_label_and_cited": parsed})
    ctrl_n = ctrl_model = ctrl_same_raw = 0
    for ca, cb in zip(a, b):  # the control arm's pools (SPEC §6): lines removed too, neither cited nor gold
        for ra, rb in zip(ca.get("control") or [], cb.get("control") or []):
            if not ra or not rb or "raw_output" not in ra or "raw_output" not in rb:  # left out (too few lines)
                continue
            ctrl_n += 1
            ctrl_model += not ra["reused"]
            ctrl_same_raw += ra["raw_output"] == rb["raw_output"] and not ra["reused"]
            if ra["raw_output"] != rb["raw_output"]:
                diffs.append({"claim": ca["id"], "control_round": ra["round"], "fae_run": ra["raw_output"],
                              "inspect": rb["raw_output"], "same_pool": ra["pool_ids"] == rb["pool_ids"]})
    return {"rounds_compared": n, "model_answered_rounds": model_rounds,
            "control_pools_compared": ctrl_n, "model_answered_control": ctrl_model,
            "same_raw_output_control_model_answered": ctrl_same_raw,
            "same_raw_output_model_answered": same_raw_model,
            "model_answered_ablated_rounds": ablated_model, "same_raw_output_ablated": same_raw_ablated,
            "same_raw_output": same_raw, "same_label_and_cited_ids": same_parsed,
            "same_pool": same_pool, "same_reused_flag": same_reused,
            "share_same_raw_output": same_raw / n, "share_same_label_and_cited_ids": same_parsed / n,
            "differences": diffs}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local HF model directory with a chat template")
    ap.add_argument("--claims", required=True, help="Check-COVID claims file (official release)")
    ap.add_argument("--corpus", required=True, help="Check-COVID corpus.json")
    ap.add_argument("--work", required=True, help="scratch directory (records, runs, logs)")
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the dtype both sides load the weights in (fae run --dtype, Inspect's -M dtype=)")
    ap.add_argument("--min-ablated-calls", type=int, default=100,
                    help="fail unless fae run generated at least this many answers on pools that lost lines "
                         "(ablation rounds >= 1 and control pools, no reuse): a cross-check of copies proves "
                         "nothing (default 100)")
    ap.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "inspect_crosscheck_tuned.json"))
    ap.add_argument("--compare-only", action="store_true",
                    help="compare the runs already in --work (fae_run/, inspect_run/) without running the model")
    args = ap.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               INSPECT_LOG_DIR=str(work / "logs"))
    records = work / "records.jsonl"
    timing = {}
    fae_dir, inspect_dir = work / "fae_run", work / "inspect_run"
    fae_cmd, inspect_cmd = run_commands(args, records, fae_dir, work / "logs")
    if args.compare_only:
        previous = Path(args.output)
        machine = None
        if previous.is_file():  # the timings and machine of the run that made the runs
            old = json.loads(previous.read_text(encoding="utf-8"))
            timing, machine = old.get("wall_seconds", {}), old.get("machine")
        return report(args, work, fae_dir, inspect_dir, fae_cmd, inspect_cmd, timing, machine)
    if not records.is_file():
        timing["convert_s"] = sh([str(BIN / "real-data"), "convert", "--dataset", "check-covid",
                                  "--claims", args.claims, "--corpus", args.corpus, "--max-pool-tokens", "200",
                                  "--tokenizer", args.model, "--output", str(records)], env, work / "convert.log")

    timing["fae_run_s"] = sh(fae_cmd, env, work / "fae_run.log")

    logs = work / "logs"
    before = set(logs.glob("*.eval")) if logs.is_dir() else set()
    timing["inspect_eval_s"] = sh(inspect_cmd, env, work / "inspect_eval.log")
    new = sorted(set(logs.glob("*.eval")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        sys.exit(f"inspect eval wrote no log under {logs}")
    log = new[-1]
    from_cmd = [str(BIN / "fae"), "from-inspect", str(log), "--output", str(inspect_dir)]
    timing["from_inspect_s"] = sh(from_cmd, env, work / "from_inspect.log")
    return report(args, work, fae_dir, inspect_dir, fae_cmd, inspect_cmd, timing)


def run_commands(args, records: Path, fae_dir: Path, logs: Path) -> tuple[list[str], list[str]]:
    """The two command lines: `fae run --backend hf` and `inspect eval ... --model hf/local`, same settings."""
    fae_cmd = [str(BIN / "fae"), "run", "--records", str(records), "--model", args.model, "--backend", "hf",
               "--device", "cpu", "--output", str(fae_dir), "--limit", str(args.limit), "--rounds", str(args.rounds),
               "--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype, "--no-progress"]
    inspect_cmd = [str(BIN / "inspect"), "eval", "real_fae/fae", "-T", f"records={records}",
                   "-T", f"rounds={args.rounds}", "-T", f"max_tokens={args.max_new_tokens}",
                   "--limit", str(args.limit), "--model", "hf/local", "-M", f"model_path={args.model}",
                   "-M", "do_sample=false", "-M", "device=cpu", "-M", f"dtype={args.dtype}",
                   "--log-dir", str(logs), "--display", "plain"]
    return fae_cmd, inspect_cmd


def notes(a, b, agreement: dict) -> list[str]:
    """What differs between the two runs, and why (from the runs themselves)."""
    out = []
    if agreement["differences"]:
        out.append(f"{len(agreement['differences'])} rounds answered differently: see 'differences'")
    ta, tb = a.metrics.get("truncated_rate"), b.metrics.get("truncated_rate")
    if ta != tb and all(x is None for x in tb or [None]):
        out.append("truncated_rate: Inspect's hf provider does not report why generation stopped, so its rounds "
                   "carry no 'truncated' key (fae run's hf backend does); the answers themselves are the same")
    if agreement["model_answered_rounds"] == len(a.claims) and all(not r["valid"] for c in a.claims
                                                                  for r in c["rounds"]):
        out.append("every round-0 answer is prose (no JSON object), so both sides reuse it for rounds 1..R without "
                   "a model call: the model-answered rounds compared are the round-0 answers, and IS/ER/IO are "
                   "null on both sides (a_0 = 0)")
    out.append("wall_seconds are not a speed comparison: the two runs shared a 2-core machine with other jobs")
    return out


def report(args, work: Path, fae_dir: Path, inspect_dir: Path, fae_cmd: list[str], inspect_cmd: list[str],
           timing: dict, machine: dict | None = None) -> int:
    a, b = load_run(fae_dir), load_run(inspect_dir)
    agreement = compare(a.claims, b.claims)
    result = {
        "what": "SmolLM2-135M-Instruct on the first Check-COVID test claims through `fae run --backend hf` and "
                "through `inspect eval real_fae/fae --model hf/local` (greedy, same answer cap), compared round "
                "by round; produced by benchmarks/inspect_crosscheck.py",
        "model": Path(args.model).name,
        "records": {"claims_file": Path(args.claims).name, "n_claims": len(a.claims), "rounds": args.rounds,
                    "records_sha256": a.config["records_sha256"]},
        "settings": {"max_new_tokens": args.max_new_tokens, "fae_run": anonymous(fae_cmd[1:], work, args.model),
                     "inspect_eval": anonymous(inspect_cmd[1:], work, args.model),
                     "fae_run_decoding": a.config["decoding"],
                     "inspect_decoding": json.loads(anonymous(b.config["decoding"], work, args.model))},
        "same_records_file": a.config["records_sha256"] == b.config["records_sha256"],
        "agreement": agreement,
        "notes": notes(a, b, agreement),
        "metrics": {k: {"fae_run": a.metrics.get(k), "inspect": b.metrics.get(k)} for k in METRICS},
        "truncated_rate": {"fae_run": a.metrics.get("truncated_rate"), "inspect": b.metrics.get("truncated_rate")},
        "wall_seconds": timing,
        "machine": machine or {"cpus": os.cpu_count(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
    }
    Path(args.output).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    ag = result["agreement"]
    print(f"same raw answer: {ag['same_raw_output']}/{ag['rounds_compared']} rounds "
          f"({ag['same_raw_output_ablated']}/{ag['model_answered_ablated_rounds']} generated ablated rounds); "
          f"same label and cited ids: {ag['same_label_and_cited_ids']}/{ag['rounds_compared']}; wrote {args.output}")
    generated = ag["model_answered_ablated_rounds"] + ag["model_answered_control"]
    print(f"generated answers on pools that lost lines: {ag['model_answered_ablated_rounds']} ablation rounds + "
          f"{ag['model_answered_control']} control pools; same raw answer on "
          f"{ag['same_raw_output_ablated'] + ag['same_raw_output_control_model_answered']} of them")
    if generated < args.min_ablated_calls:
        print(f"too few generated answers on ablated pools: {generated} < --min-ablated-calls "
              f"{args.min_ablated_calls}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
