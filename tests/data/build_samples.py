"""Rebuild the sample data shipped with the tests from full copies of Check-COVID and SciFact.

    python tests/data/build_samples.py --source DIR   # DIR holds check-covid/ and scifact/ (full files)

Each claims file keeps its first lines (unchanged bytes); each corpus keeps only the documents those
claims cite, in the corpus's own order. The output has the full copies' layout and file names, so a
test reads either through the same paths (REAL_SHARED_DATA points at the full copies).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
# claims file -> number of leading lines kept
CHECK_COVID = {"covidCheck_dev_composed+extracted.json": 40, "covidCheck_test_composed.json": 40,
               "Check-COVID_all.json": 12}
SCIFACT = {"claims_dev.jsonl": 40, "claims_train.jsonl": 40}


def _head(path: Path, n: int) -> list[str]:
    with path.open(encoding="utf-8") as fh:
        return [line for _, line in zip(range(n), fh)]


def _subset(src: Path, dst: Path, files: dict[str, int], corpus: str, cited, doc_key: str) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for name, n in files.items():
        lines = _head(src / name, n)
        (dst / name).write_text("".join(lines), encoding="utf-8")
        wanted |= {str(d) for line in lines for d in cited(json.loads(line))}
    with (src / corpus).open(encoding="utf-8") as fh:
        kept = [line for line in fh if line.strip() and str(json.loads(line)[doc_key]) in wanted]
    (dst / corpus).write_text("".join(kept), encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="folder with full check-covid/ and scifact/")
    p.add_argument("--output", type=Path, default=HERE)
    a = p.parse_args()
    _subset(a.source / "check-covid", a.output / "check-covid", CHECK_COVID, "corpus.json",
            lambda c: [c["cord_id"]], "cord_id")
    _subset(a.source / "scifact", a.output / "scifact", SCIFACT, "corpus_cited.jsonl",
            lambda c: c["cited_doc_ids"], "doc_id")


if __name__ == "__main__":
    main()
