"""`fae study` end to end on retrieved SciFact pools, against a local OpenAI-compatible server whose verifier
answers by a fixed rule: the grid, a resume after SIGKILL (same bytes), shards joined (same bytes), the
fingerprint, bad pools; then `fae study-report` over the result."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openai_server import LocalOpenAIServer
from retrieval_helpers import tiny_cross_encoder
from fae.cli import main as fae_main
from data_prep.cli import main as data_main

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO / "tests" / "data" / "scifact"
DEMO = REPO / "real" / "demo" / "base"

pytestmark = pytest.mark.slow


def verifier(body: dict) -> str:
    """A code or label string chosen by a hash of the prompt and the seed; now and then an explanation."""
    user = body["messages"][-1]["content"]
    h = int(hashlib.sha256((user + str(body.get("seed"))).encode()).hexdigest(), 16)
    codes = "exactly one of A, B or C" in user
    options = ["A", "B", "C"] if codes else ["SUPPORT", "CONTRADICT", "NOT_ENOUGH_INFO"]
    return "I think " + options[0] if h % 17 == 0 else options[h % 3]


@pytest.fixture(scope="module")
def pools(tmp_path_factory) -> Path:
    """Pools of 6 SciFact dev claims x 3 abstracts, BM25 and a tiny reranker, packed at 128 and 512 tokens."""
    root = tmp_path_factory.mktemp("pools")
    claims = root / "claims.jsonl"
    claims.write_text("".join((SCIFACT / "claims_dev.jsonl").read_text().splitlines(keepends=True)[:6]))
    corpus = str(SCIFACT / "corpus_cited.jsonl")
    assert data_main(["index", "--corpus", corpus, "--format", "scifact", "--output", str(root / "i.sqlite")]) == 0
    ce = tiny_cross_encoder(root / "ce")
    assert data_main(["retrieve", "--dataset", "scifact", "--claims", str(claims), "--corpus", corpus, "--index",
                      str(root / "i.sqlite"), "--output", str(root / "pools"), "--reranker", str(ce),
                      "--budgets", "128", "512", "--tokenizer", str(DEMO)]) == 0
    return root / "pools"


@pytest.fixture(scope="module")
def server():
    with LocalOpenAIServer(responder=verifier) as srv:
        yield srv


def args(pools: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["study", "--pools", str(pools), "--output", str(out), "--model", "m", "--backend", "openai",
            "--base-url", url, "--seeds", "1103", "2207", "--control-claims", "2", "--tokenizer", str(DEMO),
            "--chunk-size", "16", "--no-progress", *extra]


@pytest.fixture(scope="module")
def whole(pools, server, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "study"
    assert fae_main(args(pools, out, server.base_url)) == 0
    return out


def test_the_grid_is_asked_and_saved(whole):
    lines = [json.loads(x) for x in (whole / "responses.jsonl").read_text().splitlines()]
    units = [json.loads(x) for x in (whole / "units.jsonl").read_text().splitlines()]
    primary = [x for x in lines if x["kind"] == "primary"]
    assert len(primary) == len(units) * 2 * 2 * 2 * 3  # sources x budgets x formats x (greedy + 2 seeds)
    assert {x["answer"] for x in primary} >= {"SUPPORT", "REFUTE", "NOT_ENOUGH_INFO", "INVALID"}
    assert {x["control"] for x in lines if x["kind"] == "control"} == {"claim_only", "mapping", "swap", "order",
                                                                        "gold"}
    # a unit's sampled seed is the same under both sources, formats and budgets
    seeds = {(x["unit"], x["replicate"]): set() for x in primary}
    for x in primary:
        seeds[(x["unit"], x["replicate"])].add(x["seed"])
    assert all(len(s) == 1 for s in seeds.values())


def test_report_over_the_study(whole, tmp_path):
    assert fae_main(["study-report", str(whole), "--output", str(tmp_path / "r"), "--draws", "200",
                     "--exploratory-draws", "200", "--post-hoc-draws", "200"]) == 0
    report = json.loads((tmp_path / "r" / "study_report.json").read_text())
    (panel,) = report["panels"]
    assert panel["dataset"] == "scifact" and panel["primary"] == ["D_format", "D_context"]
    assert report["decision"]["label"] in ("replicated dependence", "bounded stability", "restricted/mixed evidence")
    assert (tmp_path / "r" / "contrasts.png").is_file()


def test_resume_after_sigkill_writes_the_same_bytes(pools, whole, tmp_path):
    out = tmp_path / "killed"
    with LocalOpenAIServer(responder=verifier, latency=0.02) as slow:
        cmd = [sys.executable, "-m", "fae.cli", *args(pools, out, slow.base_url), "--concurrency", "1"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            responses = out / "responses.jsonl"
            if responses.is_file() and responses.read_bytes().count(b"\n") >= 40:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert 40 <= (out / "responses.jsonl").read_bytes().count(b"\n") < (whole / "responses.jsonl").read_bytes().count(
        b"\n")
    with LocalOpenAIServer(responder=verifier) as srv:
        assert fae_main(args(pools, out, srv.base_url)) == 0
    assert (out / "responses.jsonl").read_bytes() == (whole / "responses.jsonl").read_bytes()


def test_shards_joined_equal_one_run(pools, whole, server, tmp_path):
    out = tmp_path / "sharded"
    for i in range(2):
        assert fae_main(args(pools, out, server.base_url, "--shard", f"{i}/2")) == 0
    assert not (out / "responses.jsonl").exists()
    server.reset_log()
    assert fae_main(args(pools, out, server.base_url)) == 0
    assert server.count() == 0  # every answer came from the shards
    assert (out / "responses.jsonl").read_bytes() == (whole / "responses.jsonl").read_bytes()


def test_a_resume_with_other_settings_is_refused(pools, whole, server, tmp_path, capsys):
    out = tmp_path / "copy"
    out.mkdir()
    for name in ("study.json", "units.jsonl", "responses.jsonl"):
        (out / name).write_bytes((whole / name).read_bytes())
    before = (out / "responses.jsonl").read_bytes()
    one_seed = [x for x in args(pools, out, server.base_url) if x != "2207"]
    other_model = ["other" if x == "m" else x for x in args(pools, out, server.base_url)]
    assert fae_main(one_seed) == 2
    assert fae_main(other_model) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "seeds: [1103, 2207] -> [1103]" in err[0] and "model: 'm' -> 'other'" in err[1]
    assert (out / "responses.jsonl").read_bytes() == before


def test_pools_of_two_datasets_are_refused(pools, server, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    lines = (pools / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["dataset"] = "check-covid"
    (mixed / "records.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    (mixed / "misses.jsonl").write_bytes((pools / "misses.jsonl").read_bytes())
    assert fae_main(args(mixed, tmp_path / "o", server.base_url)) == 2
    assert "mixes datasets check-covid, scifact" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_units_from_asks_another_studys_units_and_the_report_takes_both(pools, server, tmp_path, capsys):
    """A second model asked with `--units-from` the first study: the same units and sample record even when a
    families file would now sample other claims, so `fae study-report` takes the two as one dataset's panels;
    on other pools, or beside --sample, it is refused before anything is written."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert fae_main(args(pools, first, server.base_url, "--sample", "2")) == 0
    # a families file that puts every claim in one family: --sample 2 with it would take all six claims
    units = [json.loads(x) for x in (first / "units.jsonl").read_text().splitlines()]
    every = json.loads((first / "study.json").read_text())["pool_units"]
    fam = tmp_path / "one-family.jsonl"
    fam.write_text("".join(json.dumps({"id": u, "family": "all"}) + "\n" for u in every))
    model_b = [a if a != "m" else "m2" for a in args(pools, second, server.base_url, "--units-from", str(first))]
    assert fae_main(model_b) == 0
    again = [json.loads(x) for x in (second / "units.jsonl").read_text().splitlines()]
    assert [u["id"] for u in again] == [u["id"] for u in units] and len({u["claim_id"] for u in units}) == 2
    a, b = (json.loads((d / "study.json").read_text()) for d in (first, second))
    assert b["sample"] == a["sample"] and b["limit"] is None and b["units_from"] == str(first)
    assert fae_main(["study-report", str(first), str(second), "--families", str(fam), "--output", str(tmp_path / "r"),
                     "--draws", "100", "--exploratory-draws", "100", "--post-hoc-draws", "100"]) == 0
    report = json.loads((tmp_path / "r" / "study_report.json").read_text())
    assert [p["model"] for p in report["panels"]] == ["m", "m2"]
    sampled = tmp_path / "sampled"  # what --sample 2 with the new file asks instead: every claim, other units
    assert fae_main(args(pools, sampled, server.base_url, "--sample", "2", "--families", str(fam))) == 0
    assert len({json.loads(x)["claim_id"] for x in (sampled / "units.jsonl").read_text().splitlines()}) == 6
    for bad, why in ((["--units-from", str(first), "--sample", "2"], "each choose the claims"),
                     (["--units-from", str(tmp_path / "nowhere")], "study.json not found")):
        assert fae_main(args(pools, tmp_path / "bad", server.base_url, *bad)) == 2
        assert why in capsys.readouterr().err and not (tmp_path / "bad").exists()


def hf_args(pools: Path, out: Path, *extra: str) -> list[str]:
    return ["study", "--pools", str(pools), "--output", str(out), "--model", str(DEMO), "--backend", "hf",
            "--dtype", "fp32", "--seeds", "1103", "2207", "--control-claims", "1", "--sample", "2", "--no-progress",
            *extra]


def test_hf_study_end_to_end_answers_the_same_whatever_the_chunk(pools, tmp_path):
    """`fae study --backend hf` on the demo's base model (fp32): the whole grid of a two-claim sample; chunks
    of 192 prompts (shared prefixes read once, leaves decoded together) give the bytes that one prompt per
    backend call gives; the report reads it."""
    big, one = tmp_path / "big", tmp_path / "one"
    assert fae_main(hf_args(pools, big, "--chunk-size", "192")) == 0
    assert fae_main(hf_args(pools, one, "--chunk-size", "1")) == 0
    lines = [json.loads(x) for x in (big / "responses.jsonl").read_text().splitlines()]
    units = [json.loads(x) for x in (big / "units.jsonl").read_text().splitlines()]
    assert len({u["claim_id"] for u in units}) == 2
    # the demo base answers prose (INVALID), but its texts differ by prompt and seed: their bytes are compared
    assert len({x["response"] for x in lines if x["kind"] == "primary"}) > 20
    assert len([x for x in lines if x["kind"] == "primary"]) == len(units) * 2 * 2 * 2 * 3
    assert json.loads((big / "study.json").read_text())["sample"]["selected_claims"] == 2
    assert (big / "responses.jsonl").read_bytes() == (one / "responses.jsonl").read_bytes()
    assert fae_main(["study-report", str(big), "--output", str(tmp_path / "r"), "--draws", "100",
                     "--exploratory-draws", "100", "--post-hoc-draws", "100"]) == 0
