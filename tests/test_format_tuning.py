"""Format tuning for the evaluation-choice study (docs/study.md, "Models that answer: format tuning"):
recipes/study/format_tune.sh's commands and path chain (--dry-run), its INVALID-share check
(recipes/study/invalid_share.py), and a short real training of the tiny Llama on `--interface study` pairs
that leaves it answering strictly readable strings where it answered none."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TOY_POOL, make_record_dict

import data_prep.cli
import fae.cli
from data_prep.cli import main as real_data
from data_prep.prompts import encode_chat
from data_prep.records import Sentence
from fae.study.interfaces import FORMATS, INVALID, render_study_prompt
from real_fae_core.cli import build_parser

SCRIPT = REPO / "recipes" / "study" / "format_tune.sh"
CHECK = REPO / "recipes" / "study" / "invalid_share.py"
COMMITTED_REPORT = REPO / "benchmarks" / "results" / "study" / "report" / "study_report.json"
TUNED_REPORT = REPO / "benchmarks" / "results" / "study" / "report-format-tuning" / "study_report.json"
DATA_FILES = ("check-covid/covidCheck_train_composed+extracted.json", "check-covid/corpus.json",
              "scifact/claims_train.jsonl", "scifact/corpus_cited.jsonl")
BIN = Path(sys.executable).parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO),
       "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def _flags(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == name]


def _dry_run(cwd: Path, **settings) -> subprocess.CompletedProcess:
    for f in DATA_FILES:
        (cwd / "data" / f).parent.mkdir(parents=True, exist_ok=True)
        (cwd / "data" / f).touch()
    for m in ("models/smollm2-135m-instruct", "models/gemma3-270m"):
        (cwd / m).mkdir(parents=True, exist_ok=True)
    env = {**ENV, "DATA": "data", "MODELS": "models/smollm2-135m-instruct models/gemma3-270m", **settings}
    for k in ("WORK", "VARIANT", "RECIPE", "MAX_POOL_TOKENS", "MAX_LENGTH", "MEASURE", "MAX_INVALID", "PAIRS_ARGS",
              "TRAIN_ARGS", "MERGE_ARGS", "SCIFACT_SAMPLE", "COVID_SAMPLE", "CONTROL_CLAIMS", "STUDY_ARGS", "PYTHON"):
        if k not in settings:
            env.pop(k, None)
    p = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def _commands(p: subprocess.CompletedProcess) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in p.stdout.splitlines() if line.startswith("+ ")]


def _parsed(cmd: list[str]):
    """``cmd`` read by the parser of its console command (real-data, fae): every flag exists."""
    mod = {"real-data": data_prep.cli, "fae": fae.cli}[cmd[0]]
    return build_parser(cmd[0], mod.__doc__, mod.SUBCOMMANDS)[0].parse_args(cmd[1:])


def test_dry_run_prints_every_step_on_paths_an_earlier_step_produced(tmp_path):
    p = _dry_run(tmp_path, SCIFACT_SAMPLE="20", COVID_SAMPLE="10", CONTROL_CLAIMS="2")
    written = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file())
    assert written == sorted(f"data/{f}" for f in DATA_FILES), "--dry-run wrote files"
    cmds = _commands(p)
    tools = [c[0] if c[0] in ("concat", "real-train", "real-merge", "bash", "python3") else " ".join(c[:2])
             for c in cmds]
    per_model = ["real-data convert", "real-data convert", "concat", "real-data pairs", "real-train", "real-merge"]
    assert tools == [*per_model, *per_model, "bash", *["fae study"] * 4, *["fae study-report"] * 2, "python3"], tools

    produced: list[str] = [f"data/{f}" for f in DATA_FILES] + ["models/smollm2-135m-instruct", "models/gemma3-270m"]
    tuned = []
    for i, model in enumerate(("models/smollm2-135m-instruct", "models/gemma3-270m")):
        name = Path(model).name
        covid, scifact, concat, pairs, train, merge = cmds[6 * i:6 * i + 6]
        assert _parsed(covid).dataset == "check-covid" and _parsed(scifact).dataset == "scifact"
        assert _flag(scifact, "--claims") == "data/scifact/claims_train.jsonl"
        assert _flag(scifact, "--corpus") == "data/scifact/corpus_cited.jsonl"
        assert _flag(covid, "--claims") == "data/check-covid/covidCheck_train_composed+extracted.json"
        for convert in (covid, scifact):
            assert _flag(convert, "--tokenizer") == model and _flag(convert, "--max-pool-tokens") == "256"
        assert concat[2:] == [_flag(covid, "--output"), _flag(scifact, "--output")]
        args = _parsed(pairs)
        assert (args.interface, args.variant, args.tokenizer, args.records) == ("study", "no_enhancement", model,
                                                                               concat[1])
        assert _flag(train, "--config") == str(REPO / "recipes/study/format_tuning.yaml")
        assert _flag(train, "--model_name_or_path") == model and _flag(train, "--dataset_name") == args.output
        assert _flag(train, "--variant") == "no_enhancement"
        assert _flag(merge, "--adapter") == _flag(train, "--output_dir") and _flag(merge, "--base") == model
        assert _flag(merge, "--output") == f"study-work/models/{name}-format"
        for cmd in (covid, scifact, concat, pairs, train, merge):
            reads = concat[2:] if cmd is concat else [_flag(cmd, f) for f in (
                "--records", "--dataset_name", "--adapter", "--claims", "--corpus", "--tokenizer", "--base")]
            for path in reads:
                assert path is None or path in produced, f"{path} read by {shlex.join(cmd)} before it was made"
            produced.append(concat[1] if cmd is concat else _flag(cmd, "--output") or _flag(cmd, "--output_dir"))
        tuned.append(_flag(merge, "--output"))

    # held out: the untuned study, then the tuned models on the same pools, sample and tokenizers
    assert cmds[12] == ["bash", str(REPO / "recipes/study/reproduce.sh")]
    studies = cmds[13:17]
    assert [_flag(c, "--model") for c in studies] == [tuned[0], tuned[0], tuned[1], tuned[1]]
    for c in studies:
        args = _parsed(c)
        assert args.tokenizer == ["models/smollm2-135m-instruct", "models/gemma3-270m"]
        # the first untuned model's study of the same pools gives the units (and its sample record)
        dataset = args.pools.removeprefix("study-work/pools/")
        assert args.units_from == f"study-work/studies/{dataset}-smollm2-135m-instruct" and args.sample is None
        assert args.control_claims == 2 and dataset in ("scifact-dev", "check-covid-test")
    report = cmds[17]
    assert [a for a in report[2:report.index("--families")]] == [
        f"study-work/studies/{d}-{m}" for m in ("smollm2-135m-instruct", "gemma3-270m") for d in
        ("scifact-dev", "check-covid-test")] + [_flag(c, "--output") for c in studies]
    assert len(_flags(report, "--families")) == 2 and _parsed(report).output == "study-work/report-format-tuning"
    alone = cmds[18]  # the tuned models' own report: their decision label
    assert alone[2:alone.index("--families")] == [_flag(c, "--output") for c in studies]
    assert _flags(alone, "--families") == _flags(report, "--families")
    assert _parsed(alone).output == "study-work/report-tuned"
    check = cmds[19]
    assert check[1:4] == [str(CHECK), "study-work/report-format-tuning/study_report.json",
                          "--max"] and check[4] == "5"
    assert check[check.index("--models") + 1:] == ["smollm2-135m-instruct-format", "gemma3-270m-format"]
    assert "# dry run: nothing was executed" in p.stdout


def test_a_step_whose_output_is_complete_is_skipped_and_measure_0_stops_at_the_models(tmp_path):
    done = tmp_path / "study-work/format-tuning/data/gemma3-270m/check-covid-train.jsonl"
    done.parent.mkdir(parents=True)
    done.touch()
    p = _dry_run(tmp_path, MEASURE="0", VARIANT="sft")
    assert f"# done: {done.relative_to(tmp_path)}" in p.stdout
    cmds = _commands(p)
    converts = [_flag(c, "--output") for c in cmds if c[:2] == ["real-data", "convert"]]
    assert str(done.relative_to(tmp_path)) not in converts and len(converts) == 3
    assert not any(c[0] in ("fae", "bash", "python3") for c in cmds)
    assert {_parsed(c).variant for c in cmds if c[:2] == ["real-data", "pairs"]} == {"sft"}
    assert "MEASURE=0" in p.stdout


def test_missing_prerequisites_stop_a_real_run_before_the_first_step(tmp_path):
    env = {**ENV, "DATA": str(tmp_path / "nowhere"), "MODELS": str(tmp_path / "no-model")}
    p = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "+ " not in p.stdout and not list(tmp_path.iterdir())
    assert "missing data file" in p.stderr and f"missing model directory {tmp_path / 'no-model'}" in p.stderr


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=60)


def test_invalid_share_reads_the_committed_report_as_the_study_counts_it():
    report = json.loads(COMMITTED_REPORT.read_text())
    p = _check(str(COMMITTED_REPORT), "--models", "smollm2-135m-instruct")
    assert p.returncode == 1 and "2 format(s) of smollm2-135m-instruct over 5% INVALID" in p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and not line.startswith("| dataset")]
    assert len(rows) == sum(len(panel["lenient"]["invalid"]) for panel in report["panels"]) == 8
    # SmolLM2's codes answered (2.78% and 2.70% INVALID), its labels not (99.60%, 99.51%): docs/study.md
    assert "| scifact | smollm2-135m-instruct | codes | 1512 | 42 | 2.78 | ok |" in rows
    assert "| check-covid | smollm2-135m-instruct | labels | 408 | 406 | 99.51 | over |" in rows
    assert "| scifact | gemma3-270m | codes | 1512 | 1512 | 100.00 |  |" in rows  # printed, not checked
    assert _check(str(COMMITTED_REPORT)).returncode == 0
    assert _check(str(COMMITTED_REPORT), "--models", "smollm2-135m-instruct", "--max", "100").returncode == 0
    unknown = _check(str(COMMITTED_REPORT), "--models", "smollm2-135m-instruct-format")
    assert unknown.returncode == 2 and "has no panel of smollm2-135m-instruct-format" in unknown.stderr


def test_the_committed_tuned_models_answer_every_format_within_the_goal():
    """The committed format-tuned study (docs/study.md, "The tuned study"): the recipe's check passes for both
    tuned models, every one of their formats at 0 INVALID answers, while the untuned rows beside them stay
    printed and unchecked."""
    p = _check(str(TUNED_REPORT), "--max", "5", "--models", "smollm2-135m-instruct-format", "gemma3-270m-format")
    assert p.returncode == 0, p.stderr
    rows = [line.split(" | ") for line in p.stdout.splitlines() if line.startswith("| ") and "dataset" not in line]
    tuned = [r for r in rows if r[1].endswith("-format")]
    assert len(tuned) == 8 and all(r[4] == "0" and r[5] == "0.00" and r[6] == "ok |" for r in tuned), tuned
    assert {r[3] for r in tuned if r[0] == "| scifact"} == {"1512"}
    assert {r[3] for r in tuned if r[0] == "| check-covid"} == {"408"}
    assert "| scifact | gemma3-270m | labels | 1512 | 1512 | 100.00 |  |" in p.stdout  # untuned, not checked


def _held_out_answers(model_dir: Path) -> list[str]:
    """Greedy answers (16 new tokens, as the study asks) to study prompts of claims no pair was built from."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    for k in range(8):
        units = [Sentence(s["id"], s["text"], s["doc"]) for s in TOY_POOL[:2 + k % 3]]
        dataset = ("check-covid", "scifact")[k % 2]
        for fmt in ("codes", "labels"):
            ids = torch.tensor([encode_chat(tok, render_study_prompt(f"Held-out claim {k} on masks.", units,
                                                                     FORMATS[fmt], dataset))])
            with torch.no_grad():
                new = lm.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
            out.append(FORMATS[fmt].parse(tok.decode(new, skip_special_tokens=True), dataset))
    return out


def test_a_short_training_on_study_pairs_makes_the_tiny_model_answer_in_the_format(tmp_path, tiny_llama):
    """The tiny random Llama answers blank lines to every study prompt (all INVALID); 50 LoRA steps on
    `--interface study` pairs, merged as format_tune.sh merges, and it answers held-out claims' prompts with
    strings the study's strict reader takes (the codes; its labels stay out of reach at this size)."""
    recs = [make_record_dict(id=f"t{i}", dataset="check-covid", claim=f"Claim {i} about the vaccine.",
                             label="SUPPORT" if i % 2 else "REFUTE", sentences=TOY_POOL,
                             evidence=[[0]] if i % 2 else [[9]]) for i in range(12)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    pairs = tmp_path / "pairs"
    assert real_data(["pairs", "--records", str(tmp_path / "train.jsonl"), "--variant", "sft", "--interface",
                      "study", "--tokenizer", str(tiny_llama), "--output", str(pairs)]) == 0
    before = _held_out_answers(tiny_llama)
    for cmd in ([str(BIN / "real-train"), "--config", str(REPO / "recipes/tiny/llama-sft.yaml"), "--model_name_or_path",
                 str(tiny_llama), "--dataset_name", str(pairs), "--output_dir", str(tmp_path / "adapter"),
                 "--max_steps", "50", "--learning_rate", "5e-3", "--per_device_train_batch_size", "4",
                 "--save_strategy", "no", "--logging_steps", "10"],
                [str(BIN / "real-merge"), "--adapter", str(tmp_path / "adapter"), "--output", str(tmp_path / "merged")]):
        p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{cmd[0]} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    after = _held_out_answers(tmp_path / "merged")
    valid_before, valid_after = (sum(a != INVALID for a in answers) for answers in (before, after))
    assert valid_before == 0 and valid_after > valid_before, (before, after)


@pytest.mark.parametrize("doc", ["docs/study.md"])
def test_the_docs_show_the_recipe_and_the_committed_tuned_study(doc):
    text = (REPO / doc).read_text()
    section = text[text.index("## Models that answer: format tuning"):]
    assert "recipes/study/format_tune.sh" in section and "--interface study" in section
    assert "**Status: run and committed**" in section and "has not been run" not in section
    for committed in ("report-tuned/", "report-format-tuning/", "format_tuning_steps.log"):
        assert committed in section and (TUNED_REPORT.parents[1] / committed).exists(), committed
