"""FAE past one machine, measured on CPU: every path gives the rounds of one process.

    python benchmarks/scale.py [--claims 40] [--output benchmarks/results/scale_cpu.json]

Each run is a ``fae`` subprocess, as a user runs it, on the first ``--claims``
Check-COVID test claims of the samples in tests/data (or ``--records``):

- ``hf`` (the tiny test Llama, weights x5 so answers depend on the prompt):
  one process; two shards (``--shard 0/2``, ``1/2``, one after the other) +
  ``fae merge``; ``--executor ray --shards 2`` on a local Ray with 2 CPUs;
- ``openai`` against the test server (tests/openai_server.py) in its own
  process: one process; two shards + merge; Ray with 2 workers.

For each: the wall time, the driver's peak RSS (the ``fae`` process itself, from
``wait4``), and the share of claims whose rounds equal the one-process run's
(claims.jsonl compared line by line). The fleet (servers behind vllm-router)
and the client's calls per second are measured by benchmarks/fleet_client.py
and copied in here when its results file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO),
       "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV.pop("RAY_ADDRESS", None)
FLEET = REPO / "benchmarks" / "results" / "fleet_client_cpu.json"


def run_fae(argv: list[str]) -> dict:
    """One ``fae`` process: exit code, wall seconds, its own peak RSS (MiB), stderr tail."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fae.cli", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"fae {' '.join(argv[:2])} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": round(time.time() - t0, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "stdout": out}


def claims(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "claims.jsonl").read_text().splitlines()]


SOFT = ("label_probs", "label_logprobs")


def answers(c: dict) -> dict:
    """A claim without its soft-FAE probabilities: what the rounds say (pools, answers, labels, citations)."""
    return {**c, "rounds": [{k: v for k, v in r.items() if k not in SOFT} for r in c["rounds"]]}


def compare(got: Path, want: Path) -> dict:
    """Rounds equal to the one-process run's (answers exactly; label probabilities: their largest difference).

    Another split into batches pads prompts differently (hf), which moves teacher-forced
    probabilities in the 7th digit but not the greedy answers.
    """
    a, b = claims(got), claims(want)
    same = sum(answers(x) == answers(y) for x, y in zip(a, b))
    diffs = [abs(rx[key][lab] - ry[key][lab]) for x, y in zip(a, b) for rx, ry in zip(x["rounds"], y["rounds"])
             for key in SOFT if key in rx and key in ry for lab in rx[key]]
    return {"claims": len(a), "claims_with_equal_rounds": same, "share_equal": round(same / len(b), 4),
            "bitwise_equal_claims": sum(x == y for x, y in zip(a, b)),
            "label_prob_max_abs_diff": max(diffs, default=None),
            "same_order": [c["id"] for c in a] == [c["id"] for c in b]}


def paths(base: list[str], work: Path, name: str) -> dict:
    """One process, two shards merged, Ray with two shards; each compared with the one-process run."""
    one = work / f"{name}-one"
    res = {"one_process": run_fae(["run", *base, "--output", str(one)])}
    sharded = work / f"{name}-shards"
    shard_runs = [run_fae(["run", *base, "--output", str(sharded), "--shard", f"{i}/2"]) for i in range(2)]
    merged = run_fae(["merge", str(sharded)])
    res["two_shards_merged"] = {"shard_wall_s": [r["wall_s"] for r in shard_runs], "merge_wall_s": merged["wall_s"],
                                "peak_rss_mib": max(r["peak_rss_mib"] for r in shard_runs),
                                **compare(sharded, one)}
    ray_dir = work / f"{name}-ray"
    ray = run_fae(["run", *base, "--output", str(ray_dir), "--executor", "ray", "--shards", "2"])
    res["ray_two_workers"] = {"wall_s": ray["wall_s"], "driver_peak_rss_mib": ray["peak_rss_mib"],
                              **compare(ray_dir, one)}
    res["one_process"].pop("stdout")
    metrics = json.loads((one / "metrics.json").read_text())
    res["one_process"].update({k: metrics[k] for k in ("n_claims", "model_calls", "reused_calls")})
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--claims", type=int, default=60, help="records read (NEI-gold ones are left out by FAE)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--records", help="claim records (default: Check-COVID test claims of tests/data)")
    p.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "scale_cpu.json"))
    p.add_argument("--work", help="working folder (default: a temporary one, deleted)")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="fae-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        from fae_helpers import write_checkcovid
        from tiny_models import build_tiny_model

        records = Path(args.records) if args.records else write_checkcovid(REPO / "tests" / "data",
                                                                            work / "cc.jsonl", n=args.claims)
        model = noisy_llama(build_tiny_model, work)
        common = ["--records", str(records), "--rounds", str(args.rounds), "--no-progress"]
        result: dict = {"claims": args.claims, "rounds": args.rounds,
                        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
        hf = ["--model", str(model), "--batch-size", "4", "--max-new-tokens", "24", *common]
        result["hf_tiny_llama"] = paths(hf, work, "hf")
        server = subprocess.Popen([sys.executable, "tests/openai_server.py", "--port", "0", "--role", "verifier"],
                                  cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            url = server.stdout.readline().split()[-1]
            oa = ["--backend", "openai", "--model", "verifier", "--base-url", url, *common]
            result["openai_test_server"] = paths(oa, work, "openai")
        finally:
            server.terminate()
            server.wait(timeout=30)
        if FLEET.is_file():
            result["fleet"] = json.loads(FLEET.read_text())
        ok = all(r["share_equal"] == 1.0 and r["same_order"] and (r["label_prob_max_abs_diff"] or 0) < 1e-4
                 for backend in ("hf_tiny_llama", "openai_test_server")
                 for k, r in result[backend].items() if k != "one_process")
        result["all_paths_equal_one_process"] = ok
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "fleet"}, indent=2))
        return 0 if ok else 1
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def noisy_llama(build, work: Path) -> Path:
    """The tests' tiny Llama with its weights x5: answers depend on the prompt (tests/conftest.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = build(work / "tiny-llama", "llama")
    out = work / "noisy-llama"
    lm = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for prm in lm.parameters():
            prm.mul_(5.0)
    lm.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
