"""How fast `fae view`'s index opens and filters for a FEVER-size run, in headless Chromium.

A synthetic run of 50,000 claims (R = 4, six pool sentences, label probabilities on every
round) is written as `fae run` leaves a run (records, claims.jsonl, config.json with the claim
set, metrics.json); `fae view` builds the site; Chromium (fae.view.browser, the DevTools pipe)
opens index.html and applies filters through the page's controls. Reported:

- build: wall time of `fae view` and the size of the index / shards on disk;
- open: from navigation to the first rendered list (wall clock here, and the page's own
  performance.now() at the end of the first render, which counts from navigation start);
- filter: from dispatching the control's change event to the list re-rendered and the next frame
  painted (the page's clock), for a few filters;
- claim page: opening a claim (its shard loaded by a <script> tag) until rendered;
- the CPU time all of Chromium's processes spent on each step: on a busy machine wall times
  measure the queue for a core, CPU time the work itself.

    python benchmarks/view_index.py [--claims 50000] [--output benchmarks/results/view_index.txt]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from real_fae_core.hashing import sha256_file  # noqa: E402
from fae.ablation import runio  # noqa: E402
from fae.ablation.metrics import compute_metrics  # noqa: E402
from fae.view.browser import Chromium  # noqa: E402

LABELS = ("SUPPORT", "REFUTE", "NOT_ENOUGH_INFO")
WORDS = ("vaccine", "virus", "mask", "trial", "dose", "city", "river", "capital", "founder", "export", "festival",
         "protein", "cells", "patients", "study", "infection", "immunity", "symptoms", "children", "risk")


def probs(rng: random.Random, label: str) -> dict[str, float]:
    raw = {lab: rng.random() * (4.0 if lab == label else 1.0) for lab in LABELS}
    total = sum(raw.values())
    return {lab: v / total for lab, v in raw.items()}


def synthetic_run(root: Path, n: int, rounds: int = 4, seed: int = 0) -> Path:
    """records.jsonl + a finished run directory of ``n`` claims; the run directory."""
    rng = random.Random(seed)
    records, claims = [], []
    for k in range(n):
        cid = f"syn-{k}"
        gold = rng.choice(LABELS[:2])
        n_sent = 6
        sents = [{"id": i, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))) + " .",
                  "doc": f"doc{rng.randint(0, 999)}"} for i in range(n_sent)]
        gold_ids = rng.sample(range(n_sent), rng.randint(1, 2))
        records.append({"id": cid, "dataset": rng.choice(("fever", "check-covid")), "claim":
                        " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + " .", "label": gold,
                        "sentences": sents, "evidence": [gold_ids]})
        pool, rnds = list(range(n_sent)), []
        for r in range(rounds + 1):
            label = rng.choices((gold, LABELS[2], "REFUTE" if gold == "SUPPORT" else "SUPPORT", None),
                                weights=(6, 3, 1, 0.3) if r == 0 else (2, 6, 1, 0.5))[0]
            cited = rng.sample(pool, min(len(pool), rng.randint(0, 2))) if label else []
            halluc = [99] if label and rng.random() < 0.03 else []
            rnds.append({"round": r, "pool_ids": list(pool), "raw_output": json.dumps(
                {"label": label or "SUPP", "evidence": cited + halluc}), "label": label, "cited": cited,
                "hallucinated": halluc, "valid": label is not None, "reused": False, "evidence": cited + halluc,
                "error": None if label else "no label in the answer", "truncated": label is None and rng.random() < 0.5,
                "label_probs": probs(rng, label or gold)})
            pool = [i for i in pool if i not in cited]
        claims.append({"id": cid, "gold_label": gold, "gold_groups": [gold_ids], "rounds": rnds})
    rec_path = root / "records.jsonl"
    rec_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = root / "run"
    run.mkdir()
    (run / runio.CLAIMS).write_text("".join(json.dumps(c) + "\n" for c in claims))
    runio.write_json_atomic(run / runio.CONFIG, {
        "records": str(rec_path), "records_sha256": sha256_file(rec_path), "backend": "synthetic",
        "model": "synthetic", "rounds": rounds, **runio.claim_set([c["id"] for c in claims])})
    runio.write_json_atomic(run / runio.METRICS,
                            runio.stamp_metrics(compute_metrics(claims), run / runio.CLAIMS, len(claims)))
    return run


READY = "document.body.dataset.state === 'ready'"
CHANGE = """new Promise(done => {{
  const el = document.getElementById({id!r}); const t0 = performance.now();
  {set}; el.dispatchEvent(new Event('change'));
  (function wait() {{
    if (document.body.dataset.state === 'ready' && document.body.dataset.route === {route!r})
      requestAnimationFrame(() => setTimeout(() => done([performance.now() - t0,
        +document.getElementById('count').dataset.count]), 0));
    else setTimeout(wait, 1);
  }})();
}})"""


def measure(site: Path, repeats: int, claim_id: str) -> dict:
    url = (site / "index.html").as_uri()
    opens, firsts, filters, claim_ms, cpu = [], [], {}, [], {}
    steps = [("f-answer", "el.value = 'correct'", "#run=0&r=1&ans=correct", "kept the gold label at round 1"),
             ("f-flag-flipped", "el.checked = true", "#run=0&r=1&ans=correct&flags=flipped", "+ flipped"),
             ("f-sort", "el.value = 'drop'", "#run=0&r=1&ans=correct&flags=flipped&sort=drop", "+ sort by P(gold) drop"),
             ("f-q", "el.value = 'vaccine river'", "#run=0&r=1&ans=correct&flags=flipped&q=vaccine%20river&sort=drop",
              "+ text search")]
    for _ in range(repeats):
        with Chromium(width=1400, height=1000, timeout=120) as b:
            c0, t0 = b.cpu_seconds(), time.perf_counter()
            b.open(url)
            b.wait_for(READY)
            opens.append(time.perf_counter() - t0)
            cpu.setdefault("open index.html -> list rendered", []).append(b.cpu_seconds() - c0)
            firsts.append(b.evaluate("FAE_VIEW.timing.firstRender") / 1000)
            for el_id, set_js, route, what in steps:
                c0 = b.cpu_seconds()
                ms, count = b.evaluate(CHANGE.format(id=el_id, set=set_js, route=route))
                filters.setdefault(what, []).append((ms / 1000, count))
                cpu.setdefault(f"filter: {what}", []).append(b.cpu_seconds() - c0)
            t1 = time.perf_counter()
            b.evaluate(f"location.hash = '#claim={claim_id}&run=0&r=1'")
            b.wait_for(f"document.body.dataset.state === 'ready' && document.getElementById('claim-id')"
                       f" && document.getElementById('claim-id').textContent === '{claim_id}'")
            claim_ms.append(time.perf_counter() - t1)
            b.evaluate("1")
            assert not b.page_errors(), b.page_errors()
    return {"open_wall": opens, "open_page": firsts, "filters": filters, "claim": claim_ms, "cpu": cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "view_index.txt"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="view-bench-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        run = synthetic_run(tmp, args.claims)
        t_syn = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fae.cli", "view", str(run), "--output", str(tmp / "site")],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        t_build = time.perf_counter() - t0
        index_mb = (tmp / "site" / "data" / "index.js").stat().st_size / 2**20
        shards = list((tmp / "site" / "data" / "claims").glob("*.js"))
        shard_mb = sum(f.stat().st_size for f in shards) / 2**20
        res = measure(tmp / "site", args.repeats, f"syn-{2 * args.claims // 3}")
    chromium = subprocess.run(["chromium", "--version"], capture_output=True, text=True).stdout.strip()
    lines = [f"fae view on a synthetic run of {args.claims} claims (R = 4, 6 sentences each), {chromium}, headless,",
             f"{args.repeats} fresh browser starts; best / median in seconds.",
             "",
             f"synthetic run written: {t_syn:.1f} s; fae view build: {t_build:.1f} s; "
             f"index.js {index_mb:.1f} MiB, {len(shards)} detail shards {shard_mb:.1f} MiB",
             "",
             "| step | best | median | claims listed |", "|---|---:|---:|---:|"]

    def row(name, xs, count=""):
        xs = sorted(xs)
        lines.append(f"| {name} | {xs[0]:.3f} | {xs[len(xs) // 2]:.3f} | {count} |")

    row("open index.html -> list rendered (wall clock, incl. navigation)", res["open_wall"], args.claims)
    row("open -> list rendered (page clock from navigation start)", res["open_page"])
    for what, xs in res["filters"].items():
        row(f"filter: {what} (page clock, to next frame)", [x for x, _ in xs], xs[0][1])
    row("open a claim page (shard via <script>)", res["claim"])
    lines += ["", "CPU time of all the browser's processes per step (user + system; on an idle machine the wall",
              "time of a step is about this, since the page's work is one thread):", "",
              "| step | best | median |", "|---|---:|---:|"]
    for what, xs in res["cpu"].items():
        xs = sorted(xs)
        lines.append(f"| {what} | {xs[0]:.3f} | {xs[len(xs) // 2]:.3f} |")
    worst = max(max(res["open_wall"]), *(max(x for x, _ in xs) for xs in res["filters"].values()))
    lines += ["", f"slowest open or filter step: {worst:.3f} s (target: < 2 s)"]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
