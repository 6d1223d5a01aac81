"""Enhancement throughput: requests/s at 1 and 32 requests in flight against a 50 ms server.

    python benchmarks/enhance_throughput.py [--records 1000] [--serial-records 100] [--latency 0.05]

The local OpenAI-compatible server (tests/openai_server.py) runs as a separate
process and answers every request after ``--latency`` seconds, like a remote
API would; 3 annotators (3 model names) annotate every record. Each
measurement uses a fresh cache, so every request really goes over HTTP. The
serial baseline (1 in flight) runs on a subset (``--serial-records``) to keep
it short: its rate does not depend on the number of records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from openai_server import spawn  # noqa: E402 - the test server, in its own process

from data_prep.enhance.runner import EnhanceJob, enhance  # noqa: E402


def _records(n: int) -> list[dict]:
    return [
        {
            "id": f"b{k}",
            "dataset": "bench",
            "claim": f"The red fox number {k} jumps over the lazy dog.",
            "label": "SUPPORT",
            "sentences": [{"id": s, "text": f"Sentence {s}: the fox {k} jumps {'high' if s % 2 else 'far'}."}
                          for s in range(8)],
            "evidence": [[0]],
        }
        for k in range(n)
    ]


def _measure(tmp: Path, url: str, n: int, concurrency: int) -> tuple[int, float]:
    run = tmp / f"c{concurrency}"
    run.mkdir()
    inp = run / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in _records(n)))
    ann = run / "ann.yaml"
    ann.write_text("annotators:\n" + "".join(
        f"  - {{name: ann-{m}, base_url: {url}, model: bench-{m}, api_key_env: BENCH_KEY, "
        f"max_concurrency: {concurrency}, temperature: 0.0, max_tokens: 64, timeout: 30}}\n"
        for m in "abc"))
    job = EnhanceJob(records=inp, annotators=ann, output=run / "out.jsonl", cache=run / "fresh.sqlite",
                     max_in_flight=concurrency, progress=False)
    t0 = time.perf_counter()
    code, summary = enhance(job)
    elapsed = time.perf_counter() - t0
    assert code == 0 and summary["requests"]["made"] == 3 * n, summary["requests"]
    return summary["requests"]["made"], elapsed


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--serial-records", type=int, default=100)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    os.environ.setdefault("BENCH_KEY", "EMPTY")
    server, url = spawn("--latency", str(args.latency), "--role", "annotator")
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            n1, t1 = _measure(tmp, url, args.serial_records, 1)
            nc, tc = _measure(tmp, url, args.records, args.concurrency)
    finally:
        server.terminate()
        server.wait(timeout=10)
    r1, rc = n1 / t1, nc / tc
    print(f"server latency {args.latency * 1000:.0f} ms per request, 3 annotators, fresh cache per run")
    print(f"concurrency 1 : {n1:5d} requests ({args.serial_records} records x 3, subset) "
          f"in {t1:6.2f} s = {r1:7.1f} requests/s")
    print(f"concurrency {args.concurrency}: {nc:5d} requests ({args.records} records x 3) "
          f"in {tc:6.2f} s = {rc:7.1f} requests/s")
    print(f"speed-up: {rc / r1:.1f}x (ideal {args.concurrency}x; expected > 20x)")


if __name__ == "__main__":
    main()
