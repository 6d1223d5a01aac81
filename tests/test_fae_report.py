"""`fae report`: Table-1 rows, the low-accuracy warning, the trajectory plot."""

import json

from fae_helpers import seal_run
from fae_helpers import NEI, claim, ideal_claims, mixed_claims, rnd

from fae.ablation.metrics import compute_metrics
from fae.cli import main


def write_run(d, claims, model):
    d.mkdir()
    (d / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))
    (d / "config.json").write_text(json.dumps({"backend": "hf", "model": model}))
    return seal_run(d, metrics=compute_metrics(claims))


def test_table_rows_warning_and_plot(tmp_path):
    always_nei = [claim(f"n{k}", "SUPPORT", [[0]], [rnd(r, [0, 1], NEI, reused=r > 0) for r in range(5)])
                  for k in range(4)]
    runs = [write_run(tmp_path / "ideal", ideal_claims(), "m-ideal"),
            write_run(tmp_path / "mixed", mixed_claims(), "m-mixed"),
            write_run(tmp_path / "nei", always_nei, "m-nei")]
    out = tmp_path / "report"
    assert main(["report", *map(str, runs), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| ideal | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 | 100.00 |" in md
    assert "| mixed | 40.00 | 33.33 | 36.36 | 75.00 | 50.00 | 33.33 | 66.67 | 62.50 |" in md
    assert "| nei | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | n/a | n/a | n/a |" in md  # a_0 = 0: IO is not 100
    assert "nei: IS/ER/IO are n/a: a_0 = 0." in md
    assert "Warning — nei" in md and "Warning — ideal" not in md and "Warning — mixed" not in md
    assert "model `m-mixed`" in md
    assert (out / "trajectory.png").read_bytes()[:4] == b"\x89PNG"


def test_report_recomputes_from_claims_when_metrics_are_missing(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in mixed_claims()))
    seal_run(d)
    assert main(["report", str(d), "--output", str(tmp_path / "r"), "--names", "M"]) == 0
    assert "| M | 40.00 |" in (tmp_path / "r" / "report.md").read_text()
    assert main(["report", str(tmp_path / "missing"), "--output", str(tmp_path / "r")]) == 2
