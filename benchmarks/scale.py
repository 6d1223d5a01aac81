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
(claims.jsonl compared line by line).

- ``fleet``: two test servers (``--fast``, each logging the requests it served)
  behind a real ``vllm-router --policy consistent_hash``: the run through the
  router against one server directly (claims equal), the share of claims whose
  rounds all reached one server, and the split of requests between servers.

The client's calls per second (before/after the streaming client) are measured
by benchmarks/fleet_client.py and copied in here from its results file.
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
from openai_server import spawn  # noqa: E402 - the test server, in its own process
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
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
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
        from tiny_models import build_tiny_model, noisy_copy

        records = Path(args.records) if args.records else write_checkcovid(REPO / "tests" / "data",
                                                                            work / "cc.jsonl", n=args.claims)
        # the tests' tiny Llama with its weights x5: answers depend on the prompt (tests/conftest.py)
        model = noisy_copy(build_tiny_model(work / "tiny-llama", "llama"), work / "noisy-llama")
        common = ["--records", str(records), "--rounds", str(args.rounds), "--no-progress"]
        result: dict = {"claims": args.claims, "rounds": args.rounds,
                        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
        hf = ["--model", str(model), "--batch-size", "4", "--max-new-tokens", "24", *common]
        result["hf_tiny_llama"] = paths(hf, work, "hf")
        server, url = spawn("--role", "verifier")
        try:
            oa = ["--backend", "openai", "--model", "verifier", "--base-url", url, *common]
            result["openai_test_server"] = paths(oa, work, "openai")
        finally:
            server.terminate()
            server.wait(timeout=30)
        result["fleet_vllm_router"] = fleet(records, work, args.rounds)
        if FLEET.is_file():
            client = json.loads(FLEET.read_text())
            result["client_calls_per_second"] = {"before": client["before"]["client_calls_per_second"],
                                                 "after": client["after"]["client_calls_per_second"],
                                                 "source": str(FLEET.relative_to(REPO))}
        ok = all(r["share_equal"] == 1.0 and r["same_order"] and (r["label_prob_max_abs_diff"] or 0) < 1e-4
                 for backend in ("hf_tiny_llama", "openai_test_server")
                 for k, r in result[backend].items() if k != "one_process")
        ok = ok and fleet_ok(result["fleet_vllm_router"])
        result["all_paths_equal_one_process"] = ok
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "fleet"}, indent=2))
        return 0 if ok else 1
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def served_rows(log: Path) -> list[dict]:
    """What reached one test server: a row per request (``session``: its routing header, ``claim``: its claim)."""
    return [json.loads(line) for line in log.read_text().splitlines()]


def fleet_routing(served: list[list[dict]], run_name: str) -> dict:
    """How the router placed a run's requests (``served``: the rows of each server).

    A claim on one server alone proves nothing by itself: without the routing header consistent_hash
    hashes an empty key and sends every claim to the same server. So the requests' keys are counted too:
    the share that carried ``<run_name>/<claim id>``, and whether each claim had exactly one key."""
    per_server: list[dict[str, set]] = []
    for rows in served:
        keys: dict[str, set] = {}
        for row in rows:
            keys.setdefault(row["claim"], set()).add(row["session"])
        per_server.append(keys)
    claims = set().union(*per_server) if per_server else set()
    on_several = {c for c in claims if sum(c in keys for keys in per_server) > 1}
    rows = [row for rows in served for row in rows]
    keyed = [r for r in rows if isinstance(r["session"], str) and r["session"].startswith(f"{run_name}/")]
    key_sets: dict[str, set] = {}
    for keys in per_server:
        for claim, seen in keys.items():
            key_sets.setdefault(claim, set()).update(seen)
    return {"requests_per_server": [len(r) for r in served], "claims_per_server": [len(k) for k in per_server],
            "claims_on_one_server_share": round(1 - len(on_several) / len(claims), 4) if claims else None,
            "requests_with_routing_key_share": round(len(keyed) / len(rows), 4) if rows else None,
            "one_routing_key_per_claim": bool(key_sets) and all(len(k) == 1 for k in key_sets.values())}


def fleet_ok(fleet: dict) -> bool:
    """The fleet path passes when every request carried its claim's routing key (one per claim), every claim's
    rounds reached one server, every server was used, and the claims equal a run against one server directly.
    A run that sent no key fails, though each claim then sits on one server too (all on the same one)."""
    if "skipped" in fleet:
        return False
    return (fleet["requests_with_routing_key_share"] == 1.0 and fleet["one_routing_key_per_claim"]
            and fleet["claims_on_one_server_share"] == 1.0 and all(n > 0 for n in fleet["claims_per_server"])
            and fleet["share_equal"] == 1.0)


def fleet(records: Path, work: Path, rounds: int, routing_header: str | None = None) -> dict:
    """Two servers behind ``vllm-router --policy consistent_hash``: one server per claim, the claims of one server.

    ``routing_header``: fae run's ``--routing-header`` (default: its own, X-Session-ID; "" sends none)."""
    import socket
    import urllib.request

    router_exe = shutil.which("vllm-router")
    if router_exe is None:
        return {"skipped": "vllm-router is not installed (pip install 'real-fae[fleet]')"}

    def port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    procs, logs, urls = [], [], []
    try:
        for name in ("a", "b"):
            log = work / f"server-{name}.jsonl"
            proc, url = spawn("--fast", "--role", "stepwise", "--name", name, "--log", str(log))
            procs.append(proc)
            urls.append(url.removesuffix("/v1"))
            logs.append(log)
        router_url = f"http://127.0.0.1:{port()}"
        procs.append(subprocess.Popen([router_exe, "--host", "127.0.0.1", "--port", router_url.rsplit(":", 1)[1],
                                       "--prometheus-port", str(port()), "--log-level", "error",
                                       "--policy", "consistent_hash", "--worker-urls", *urls],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(router_url + "/health", timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("vllm-router did not start")
                time.sleep(0.1)
        base = ["--backend", "openai", "--model", "verifier", "--records", str(records), "--rounds", str(rounds),
                "--no-progress"]
        header = [] if routing_header is None else ["--routing-header", routing_header]
        routed = run_fae(["run", *base, *header, "--base-url", router_url + "/v1",
                          "--output", str(work / "fleet-routed")])
        served = [served_rows(log) for log in logs]
        for log in logs:
            log.write_text("")
        direct = run_fae(["run", *base, "--base-url", urls[0] + "/v1", "--output", str(work / "fleet-direct")])
        return {"servers": 2, "router": "vllm-router 0.1.17 --policy consistent_hash",
                "routing_header": "(none)" if routing_header == "" else
                f"{routing_header or 'X-Session-ID'}: <run>/<claim id>",
                **fleet_routing(served, "fleet-routed"),
                "routed_wall_s": routed["wall_s"], "direct_wall_s": direct["wall_s"],
                "driver_peak_rss_mib": routed["peak_rss_mib"],
                **compare(work / "fleet-routed", work / "fleet-direct")}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
