"""Client speed of ``fae run --backend openai``: calls per second, CPU seconds and peak RSS on one core.

The server is ``tests/openai_server.py --fast`` (instant answers, one asyncio
loop, keep-alive) in its own process, pinned to another core than the client
where the machine has two, so the client is what is measured. Two clients ablate
the same synthetic claims (each claim has five lines sharing words with it; the
``stepwise`` verifier cites one per round, so R = 4 costs five model calls per
claim):

- ``before``: :func:`fae.ablation.engine.run_ablation` + ``OpenAIBackend.generate``
  (a barrier across claims each step, a fresh client and event loop per step);
- ``after``: :func:`fae.ablation.streaming.run_ablation_streaming` (each claim
  steps on its own, one client and one event loop for the run).

Each client runs in a fresh process that reports its own CPU time and peak RSS
(``getrusage``); the server's CPU time over the same window shows whether it was
the bottleneck. Both clients must produce the same claims.

    python benchmarks/fleet_client.py                  # 1000 claims x R=4, concurrency 64
    python benchmarks/fleet_client.py --json benchmarks/results/fleet_client_cpu.json

Measured on the 2-core build machine (shared with other jobs; client and server
pinned to one core each), 1000 claims x R = 4, 5000 model calls, concurrency 64,
three runs: per second of client CPU, before 280-320 calls (3.1-3.6 ms each,
15.6-17.9 CPU s), after 700-760 (1.3-1.4 ms each, 6.6-7.2 CPU s); peak RSS 82
-> 75-78 MiB. Wall-clock rates depend on what else runs: 193 -> 741 calls/s,
229 -> 466, 315 -> 634 (the JSON keeps the last run and the load average). The
server used 0.6-1.4 CPU s per client run, so it was never the bottleneck.
Where the "after" client's CPU went before the changes that got it there
(py-spy): the httpx connection pool checks every pooled connection on each
request (aiohttp transport instead: 2.5 -> 1.5 ms per call) and
``chat.completions.create`` walks the message types of every request (the body
posted as is: 1.5 -> 1.3 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from openai_server import spawn  # noqa: E402 - the test server, in its own process

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def make_records(n: int):
    from data_prep.records import ClaimRecord, Sentence

    out = []
    for k in range(n):
        w = [WORDS[(k + j) % len(WORDS)] for j in range(6)]
        claim = f"claim {k}: {' '.join(w[:4])} are related"
        sents = []
        for i in range(8):
            if i % 8 < 5:  # shares two claim words: cited, one per round
                text = f"sentence {i} of {k} mentions {w[i % 4]} and {w[(i + 1) % 4]} together"
            else:
                text = f"sentence {i} of {k} is about something else entirely number {i * 7}"
            sents.append(Sentence(i, text, "doc"))
        out.append(ClaimRecord(id=f"c{k:06d}", claim=claim, label="SUPPORT", sentences=sents, evidence=[[0]]))
    return out


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client(mode: str, url: str, n: int, rounds: int, concurrency: int, out: str, cpu: int | None) -> None:
    """One measured client in this process; prints one JSON line."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from fae.ablation.engine import run_ablation
    from fae.ablation.streaming import run_ablation_streaming
    from fae.backends.openai_backend import OpenAIBackend

    records = make_records(n)
    backend = OpenAIBackend({"model": "verifier", "base_url": url, "concurrency": concurrency,
                             "label_probs": False, "max_retries": 0})
    claims: list[dict] = []
    start_cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    t0 = time.perf_counter()
    if mode == "before":
        stats = run_ablation(records, backend, rounds, claims.extend, chunk_size=concurrency, progress=False)
    else:
        stats = run_ablation_streaming(records, backend, rounds, claims.extend, run_name="bench",
                                       progress=False)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    claims.sort(key=lambda c: c["id"])
    Path(out).write_text("".join(json.dumps(c, sort_keys=True) + "\n" for c in claims))
    print(json.dumps({"mode": mode, "claims": stats["claims"], "model_calls": stats["model_calls"],
                      "reused_calls": stats["reused_calls"], "wall_s": round(wall, 3),
                      "client_cpu_s": round(ru.ru_utime + ru.ru_stime - start_cpu, 3),
                      "client_calls_per_second": round(stats["model_calls"] / wall, 1),
                      "client_cpu_ms_per_call": round(1000 * (ru.ru_utime + ru.ru_stime - start_cpu)
                                                      / max(stats["model_calls"], 1), 3),
                      # what one core sustains when the client has it to itself (wall time shares the core
                      # with whatever else runs on the machine)
                      "calls_per_client_cpu_second": round(stats["model_calls"]
                                                           / max(ru.ru_utime + ru.ru_stime - start_cpu, 1e-9), 1),
                      "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
                      "requests": backend.stats["requests"]}))


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--client", choices=["before", "after"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client(args.client, args.url, args.claims, args.rounds, args.concurrency, args.out, args.cpu)
        return
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = (cores[0], cores[1]) if len(cores) > 1 else (None, None)
    pre = [] if server_cpu is None else ["taskset", "-c", str(server_cpu)]
    server, url = spawn("--fast", "--role", "stepwise", pre=tuple(pre))
    results = []
    try:
        with tempfile.TemporaryDirectory() as d:
            outs = {}
            for mode in ("before", "after"):
                outs[mode] = Path(d) / f"{mode}.jsonl"
                s0 = cpu_of(server.pid)
                cmd = [sys.executable, __file__, "--client", mode, "--url", url, "--claims", str(args.claims),
                       "--rounds", str(args.rounds), "--concurrency", str(args.concurrency),
                       "--out", str(outs[mode])]
                if client_cpu is not None:
                    cmd += ["--cpu", str(client_cpu)]
                res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                                 .strip().splitlines()[-1])
                res["server_cpu_s"] = round(cpu_of(server.pid) - s0, 3)
                results.append(res)
                print(json.dumps(res), flush=True)
            same = outs["before"].read_bytes() == outs["after"].read_bytes()
    finally:
        server.terminate()
        server.wait(timeout=10)
    before, after = results
    summary = {
        "what": "fae run --backend openai client against an instant server in another process "
                "(tests/openai_server.py --fast, stepwise verifier)",
        "claims": args.claims, "rounds": args.rounds, "concurrency": args.concurrency,
        "client_core_pinned": client_cpu is not None, "cpu_count": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "before": before, "after": after, "same_claims": same,
        "speedup": round(after["client_calls_per_second"] / before["client_calls_per_second"], 2),
    }
    for name, r in (("before", before), ("after", after)):
        print(f"{name}: {r['client_calls_per_second']} calls/s ({r['calls_per_client_cpu_second']} per client CPU "
              f"second), {r['client_cpu_s']} client CPU s, server {r['server_cpu_s']} CPU s, "
              f"peak RSS {r['peak_rss_mib']} MiB")
    print(f"same claims: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if not same:
        raise SystemExit("the two clients produced different claims")


if __name__ == "__main__":
    main()
