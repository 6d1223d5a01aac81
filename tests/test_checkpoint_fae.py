"""FAE of checkpoints: `fae checkpoints` over a real training output, and the training callback's fae/* logs."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, toy_training_records

from data_prep.cli import main as real_data
from fae.ablation.checkpoints import COLUMNS, checkpoint_row
from fae.cli import main as fae
from real_fae_core.errors import UserError

REAL_TRAIN = str(Path(sys.executable).with_name("real-train"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
FAE_OPTIONS = ["--limit", "4", "--rounds", "1", "--batch-size", "4", "--max-new-tokens", "24",
               "--constrained-decoding", "--no-label-probs", "--no-progress"]


def records(path: Path) -> Path:
    recs = toy_training_records(6)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, noisy_llama):
    """A tiny REAL run (8 steps, a checkpoint every 4) with the FAE callback on, as `real-train` runs it."""
    d = tmp_path_factory.mktemp("ckpt")
    recs = records(d / "train.jsonl")
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(d / "pairs"),
                      "--tokenizer", str(noisy_llama)]) == 0
    out = d / "out"
    p = subprocess.run([REAL_TRAIN, "--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"),
                        "--model_name_or_path", str(noisy_llama), "--dataset_name", str(d / "pairs"),
                        "--output_dir", str(out), "--learning_rate", "5e-3", "--save_steps", "4",
                        "--fae_eval_records", str(recs),
                        "--fae_eval", "limit=4,rounds=1,max_new_tokens=24,constrained_decoding=true"],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return {"records": recs, "out": out, "model": noisy_llama}


@pytest.mark.slow
def test_every_checkpoint_gets_a_row_equal_to_a_direct_fae_run_and_a_rerun_skips(trained, tmp_path):
    out, recs = trained["out"], trained["records"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
    ev = tmp_path / "ev"
    assert fae(["checkpoints", "--training-output", str(out), "--records", str(recs), "--output", str(ev),
                *FAE_OPTIONS]) == 0
    table = json.loads((ev / "checkpoints.json").read_text())
    assert table["columns"] == list(COLUMNS) and [r["step"] for r in table["rows"]] == [4, 8]
    with (ev / "checkpoints.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [4, 8] and list(rows[0]) == list(COLUMNS)
    assert (ev / "checkpoints.png").stat().st_size > 1000

    # the second measure: a plain `fae run` of checkpoint-4 (the base model given explicitly)
    direct = tmp_path / "direct"
    assert fae(["run", "--records", str(recs), "--output", str(direct), "--model", str(trained["model"]),
                "--adapter", str(out / "checkpoint-4"), *FAE_OPTIONS]) == 0
    expected = checkpoint_row(json.loads((direct / "metrics.json").read_text()))
    assert {k: table["rows"][0][k] for k in expected} == expected
    assert expected["valid_rate"] == 1.0  # constrained: every answer parses
    assert json.loads((ev / "checkpoint-4" / "claims.jsonl").read_text().splitlines()[0]) \
        == json.loads((direct / "claims.jsonl").read_text().splitlines()[0])

    # rerun: nothing is evaluated again (no new run-log entry), the table is the same
    logs = {c: (ev / c / "runs.jsonl").read_text() for c in ("checkpoint-4", "checkpoint-8")}
    assert fae(["checkpoints", "--training-output", str(out), "--records", str(recs), "--output", str(ev),
                *FAE_OPTIONS]) == 0
    assert {c: (ev / c / "runs.jsonl").read_text() for c in logs} == logs
    assert json.loads((ev / "checkpoints.json").read_text()) == table


@pytest.mark.slow
def test_the_callback_logs_fae_at_each_save_as_the_command_measures_it(trained, tmp_path):
    """fae/* entries at steps 4 and 8 in the final trainer_state.json; the step-8 numbers (the final weights,
    evaluated in memory, unmerged) equal `fae checkpoints` on checkpoint-8 (reloaded, merged)."""
    out, recs = trained["out"], trained["records"]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    fae_logs = {h["step"]: h for h in history if "fae/acc" in h}
    assert sorted(fae_logs) == [4, 8]
    assert all({"fae/acc", "fae/er", "fae/valid_rate"} <= set(h) for h in fae_logs.values())
    assert any("loss" in h for h in history)  # training went on logging after the evaluations
    ev = tmp_path / "ev"
    assert fae(["checkpoints", "--training-output", str(out), "--records", str(recs), "--output", str(ev),
                "--no-plot", *FAE_OPTIONS]) == 0
    row = json.loads((ev / "checkpoints.json").read_text())["rows"][1]
    assert row["valid_rate"] == 1.0 and row["Acc"] is not None and row["nei_rate_r1"] is not None
    for key in ("Acc", "ER", "valid_rate", "nei_rate_r1"):
        assert fae_logs[8].get(f"fae/{key.lower()}") == pytest.approx(row[key]), key
    assert not (ev / "checkpoints.png").exists()


def test_bad_inputs_are_one_line(tmp_path, capsys):
    assert fae(["checkpoints", "--training-output", str(tmp_path / "none"), "--records", "r.jsonl",
                "--output", str(tmp_path / "ev")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty" / "checkpoint-3").mkdir(parents=True)
    assert fae(["checkpoints", "--training-output", str(tmp_path / "empty"), "--records", "r.jsonl",
                "--output", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint-N directory with an adapter" in err and "skipping" in err
    assert fae(["checkpoints", "--training-output", str(tmp_path), "--output", str(tmp_path / "ev"),
                "--adapter", "x"]) == 2
    assert "--adapter is set per checkpoint" in capsys.readouterr().err


def test_checkpoint_row_reads_round_one_and_validity():
    row = checkpoint_row({"label_accuracy": 0.5, "IS": None, "ER": 0.25, "IO": 0.1,
                          "nei_answer_rate": [0.0, 0.75, 1.0], "invalid_rate": [0.2, 0.0, 0.0]})
    assert row == {"Acc": 0.5, "IS": None, "ER": 0.25, "IO": 0.1, "nei_rate_r1": 0.75, "valid_rate": 0.8}
    assert checkpoint_row({"nei_answer_rate": [0.1], "invalid_rate": [None]})["nei_rate_r1"] is None


def _script_args(**values):
    from real.training.args import RealScriptArguments

    return RealScriptArguments(dataset_name="d", **values)


def test_the_callback_options_are_fae_run_options_checked_by_its_loader(tmp_path):
    """One option set: `fae_eval` takes fae run's names and checks; the old fae_eval_<key> fields still count."""
    import logging

    from real.training.fae_callback import eval_options

    recs = str(records(tmp_path / "r.jsonl"))
    opts = eval_options(_script_args(fae_eval_records=recs, fae_eval={"rounds": 3, "batch_size": 2}))
    assert (opts.rounds, opts.batch_size, opts.limit, opts.max_new_tokens) == (3, 2, 20, 64)
    assert eval_options(_script_args(fae_eval_records=recs, fae_eval="rounds=1,label_probs=true")).label_probs
    for value, message in [({"device": "cpu"}, "fae_eval: device is a `fae run` option the FAE at each save "
                                                "does not read"),
                           ({"rnds": 1}, "fae_eval: rnds is not a `fae run` option"),
                           ({"rounds": -1}, "fae_eval: rounds: must be >= 0, got -1"),
                           ("rounds", "fae_eval: 'rounds' is not KEY=VALUE")]:
        with pytest.raises(UserError, match=re.escape(message)):
            eval_options(_script_args(fae_eval_records=recs, fae_eval=value))
    logger = logging.getLogger("real.train")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        assert eval_options(_script_args(fae_eval_records=recs, fae_eval_rounds=1)).rounds == 1
    finally:
        logger.removeHandler(handler)
    assert seen == ["fae_eval_rounds is deprecated; use fae_eval: {rounds: 1} (accepted until 0.2)"]
    with pytest.raises(UserError, match=r"fae_eval: rounds is also given as fae_eval_rounds"):
        eval_options(_script_args(fae_eval_records=recs, fae_eval={"rounds": 2}, fae_eval_rounds=1))
