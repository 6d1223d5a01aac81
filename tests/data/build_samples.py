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
               "Check-COVID_all.json": 12, "covidCheck_train_composed+extracted.json": 40}
SCIFACT = {"claims_dev.jsonl": 40, "claims_train.jsonl": 40}
# and, after them in file order, these claims: their gold has a value a rule can provably swap
# (tests/test_counterfactual.py needs SUPPORT and REFUTE ones in every file it converts)
RULE_SWAPPABLE = {
    "covidCheck_dev_composed+extracted.json": {"6009edf66bc088b6d218dbd7_1", "609486a6f9b9e03ea4d8e52b_3",
                                               "609486a6f9b9e03ea4d8e52b_5"},
    "covidCheck_train_composed+extracted.json": {"606fc362f9b9e03ea4d8e49c_0", "5f7a4855e95347460249fc30_0",
                                                 "60adb4c6f9b9e03ea4d8e699_0", "60953704f9b9e03ea4d8e53d_0",
                                                 "600e35846bc088b6d218dbe1_1", "606fc24bf9b9e03ea4d8e49a_1"},
    "claims_dev.jsonl": {"279", "1185"},
}


def _head(path: Path, n: int) -> list[str]:
    """The first ``n`` lines, then the later lines of the claims in RULE_SWAPPABLE (unchanged bytes)."""
    wanted = RULE_SWAPPABLE.get(path.name, set())
    with path.open(encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    later = [line for line in lines[n:] if str(json.loads(line)["id"]) in wanted]
    return lines[:n] + later


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
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, required=True, help="folder with full check-covid/ and scifact/")
    p.add_argument("--output", type=Path, default=HERE)
    a = p.parse_args()
    _subset(a.source / "check-covid", a.output / "check-covid", CHECK_COVID, "corpus.json",
            lambda c: [c["cord_id"]], "cord_id")
    _subset(a.source / "scifact", a.output / "scifact", SCIFACT, "corpus_cited.jsonl",
            lambda c: c["cited_doc_ids"], "doc_id")


if __name__ == "__main__":
    main()
