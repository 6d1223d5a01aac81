"""Benchmark: `real-data convert --dataset fever` on a generated FEVER-format dump.

Generates (in a temp dir) wiki-pages shards in the official format and a
claims file citing a fraction of the pages, runs the converter as a
subprocess, and prints claims/s, pages/s and the converter's peak RSS. The
baseline, measured in the same run, is the naive pass 2 that json-decodes
every wiki line instead of reading only the title of uncited pages.

    python benchmarks/convert_fever.py                 # 100k claims, 500k pages
    python benchmarks/convert_fever.py --claims 10000 --pages 50000
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_prep.converters.fever import (  # noqa: E402
    load_pages,
    needed_pages,
    norm_title,
    parse_lines,
    wiki_shards,
)

WORDS = ("the of and film actor born river city album band season series team player county "
         "released american british village station species football novel song school").split()


def sentence(rng: random.Random) -> str:
    n = rng.randint(6, 14)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.2:
        words.insert(2, "-LRB- " + str(rng.randint(1900, 2020)) + " -RRB-")
    return " ".join(words).capitalize() + " ."


def generate(root: Path, n_claims: int, n_pages: int, cited_fraction: float, seed: int = 0):
    rng = random.Random(seed)
    wiki = root / "wiki-pages"
    wiki.mkdir()
    per_shard = 50_000
    n_lines: list[int] = []
    fh = None
    for p in range(n_pages):
        if p % per_shard == 0:
            if fh:
                fh.close()
            fh = (wiki / f"wiki-{p // per_shard + 1:03d}.jsonl").open("w", encoding="utf-8")
        sents = [sentence(rng) for _ in range(rng.randint(3, 6))]
        if rng.random() < 0.1:
            sents.insert(rng.randint(1, len(sents)), "")  # FEVER pages have empty lines
        n_lines.append(len(sents))
        lines = "\n".join(f"{i}\t{s}" + ("\tLink\tLink" if s else "") for i, s in enumerate(sents))
        fh.write(json.dumps({"id": f"Page_{p}_-LRB-x-RRB-", "text": " ".join(sents), "lines": lines}) + "\n")
    fh.close()

    cited = rng.sample(range(n_pages), max(1, int(n_pages * cited_fraction)))
    claims = root / "train.jsonl"
    with claims.open("w", encoding="utf-8") as out:
        for c in range(n_claims):
            r = rng.random()
            if r < 0.25:
                label, ev = "NOT ENOUGH INFO", [[[c, None, None, None]]]
            else:
                label = "SUPPORTS" if r < 0.65 else "REFUTES"
                ev = []
                for g in range(rng.randint(1, 3)):
                    group = []
                    for _ in range(1 if rng.random() < 0.8 else 2):
                        p = rng.choice(cited)
                        group.append([c, g, f"Page_{p}_-LRB-x-RRB-", 0])  # line 0 is never empty
                    ev.append(group)
            out.write(json.dumps({"id": c, "verifiable": "VERIFIABLE", "label": label,
                                  "claim": f"Claim {c} about the film .", "evidence": ev}) + "\n")
    return claims, wiki


def naive_load_pages(wiki: Path, needed: set[str]) -> dict[str, list[str]]:
    """Baseline pass 2: decode every line with json.loads."""
    pages = {}
    for shard in wiki_shards(wiki):
        with shard.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                obj = json.loads(line)
                key = norm_title(obj["id"])
                if key in needed and key not in pages:
                    pages[key] = parse_lines(obj["lines"], shard, lineno)
    return pages


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=100_000)
    ap.add_argument("--pages", type=int, default=500_000)
    ap.add_argument("--cited-fraction", type=float, default=0.1)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        claims, wiki = generate(root, args.claims, args.pages, args.cited_fraction)
        dump_mb = sum(p.stat().st_size for p in wiki.iterdir()) / 2**20
        print(f"generated {args.claims} claims, {args.pages} pages ({dump_mb:.0f} MiB) "
              f"in {time.perf_counter() - t:.1f}s")

        out = root / "records.jsonl"
        cmd = [sys.executable, "-m", "data_prep.cli", "convert", "--dataset", "fever",
               "--claims", str(claims), "--wiki-pages", str(wiki), "--output", str(out)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
        print(proc.stdout.rstrip())
        print(f"converter: {wall:.1f}s wall, {args.claims / wall:,.0f} claims/s, "
              f"{args.pages / wall:,.0f} pages/s, peak RSS {peak_mb:,.0f} MiB "
              f"(dump {dump_mb:,.0f} MiB, output {out.stat().st_size / 2**20:,.0f} MiB, "
              f"{summary['records_written']} records)")

        needed = needed_pages([claims])
        t = time.perf_counter()
        fast = load_pages(wiki, needed)
        t_fast = time.perf_counter() - t
        t = time.perf_counter()
        slow = naive_load_pages(wiki, needed)
        t_slow = time.perf_counter() - t
        assert fast == slow, "fast and naive page loading disagree"
        print(f"pass 2 (stream shards, keep {len(fast)} cited pages): {t_fast:.1f}s "
              f"vs naive json.loads of every line {t_slow:.1f}s -> {t_slow / t_fast:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
