"""The API key never reaches a file, a log or stderr, even when the server echoes it back.

Careless servers (and proxies) put the request's ``Authorization`` header in
their 400/401/429/5xx bodies, and the openai client copies those bodies into
its exception messages. The local server's ``echo_auth`` mode does exactly
that, whole and as the bare token (a shape no pattern recognises: only the
registered key masks it). For each command that talks to an OpenAI-compatible
server (``real-data enhance``, ``fae run --backend openai``, ``fae pave
--backend openai``) every file under the output directory (the SQLite cache
as bytes, lock files, logs) and everything printed is grepped for the key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from enhance_world import (
    annotators_yaml,
    claim_index,
    make_records,
    responder,
    write_records,
)
from fae_helpers import write_checkcovid
from openai_server import LocalOpenAIServer

from data_prep.records import save_records
from fae.cli import main as fae_main
from helpers import make_record_dict

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-LEAKCHECK-9f8e7d6c5b4a-secret"
MARK = b"LEAKCHECK"  # any piece of the key that carries this is a leak too
ENV = "SECRETS_TEST_KEY"
STATUSES = ("400", "401", "429", "500")


def assert_no_key(*dirs: Path, texts=()) -> int:
    """Every file under ``dirs`` (read as bytes) and every text: no trace of the key. Returns files read."""
    n = 0
    for d in dirs:
        for f in Path(d).rglob("*"):
            if f.is_file():
                n += 1
                assert MARK not in f.read_bytes(), f"key leaked into {f}"
    for t in texts:
        assert MARK.decode() not in t, f"key leaked into output: {t[:300]}"
    return n


def always(status):
    return lambda body, attempt: status


@pytest.mark.parametrize("status", STATUSES)
def test_fae_run_openai_never_writes_or_prints_the_echoed_key(status, shared_data, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, KEY)
    records = write_checkcovid(shared_data, tmp_path / "cc.jsonl", n=3)
    out = tmp_path / "run"
    with LocalOpenAIServer(faults=always(status), echo_auth=True, api_key=KEY) as srv:
        rc = fae_main(["run", "--backend", "openai", "--model", "verifier", "--base-url", srv.base_url,
                       "--api-key-env", ENV, "--records", str(records), "--output", str(out),
                       "--rounds", "1", "--concurrency", "2", "--max-retries", "1", "--backoff-base", "0.01",
                       "--no-progress"])
        assert srv.count(outcome=status) >= 1
        assert any(r.authorization == f"Bearer {KEY}" for r in srv.log)  # the key really went out
    cap = capfd.readouterr()
    assert rc == 1
    assert f"HTTP {int(status)}" in cap.err and "***" in cap.err  # the echoed body was there, masked
    assert "Traceback" not in cap.err
    log = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert "***" in log[-1]["error"]  # the run log keeps the error, masked
    assert assert_no_key(out, texts=[cap.out, cap.err]) >= 3


def _pave_records(tmp_path: Path) -> Path:
    recs = [make_record_dict(id=f"r{k}", claim=f"Claim number {k} holds.", label="SUPPORT") for k in range(3)]
    path = tmp_path / "eval.jsonl"
    save_records(recs, path)
    return path


@pytest.mark.parametrize("status", STATUSES)
def test_fae_pave_openai_never_writes_or_prints_the_echoed_key(status, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, KEY)
    records = _pave_records(tmp_path)
    out = tmp_path / "pave"
    with LocalOpenAIServer(faults=always(status), echo_auth=True, api_key=KEY) as srv:
        rc = fae_main(["pave", "--records", str(records), "--backend", "openai", "--model", "m",
                       "--base-url", srv.base_url, "--api-key-env", ENV, "--samples", "2",
                       "--temperature", "0.8", "--output", str(out), "--no-progress", "--max-retries", "0"])
        assert srv.count(outcome=status) >= 1
    cap = capfd.readouterr()
    assert rc == 1  # a runtime failure, not an "internal error"
    assert f"HTTP {int(status)}" in cap.err and "***" in cap.err
    assert "internal error" not in cap.err and "Traceback" not in cap.err
    assert "rerun the same command to resume" in cap.err
    assert assert_no_key(out, texts=[cap.out, cap.err]) >= 1


def _enhance_plan(body, attempt):
    """Each annotator meets every echoing status: alpha 400/429, beta 401 (stops it), gamma 500/429."""
    k = claim_index(body)
    model = body["model"]
    if model == "ann-a":
        return "400" if k % 2 == 0 else "429"
    if model == "ann-b":
        return "401"
    return "500" if k % 2 == 0 else "429"


def test_enhance_never_writes_or_prints_the_echoed_key(tmp_path):
    inp = write_records(tmp_path / "in.jsonl", make_records(4, nei=False))
    work = tmp_path / "run"
    with LocalOpenAIServer(responder=responder, faults=_enhance_plan, echo_auth=True, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, env=ENV, max_retries=1)
        env = dict(os.environ, **{ENV: KEY}, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", "data_prep.cli", "enhance", "--records", str(inp), "--annotators", str(ann),
             "--output", str(work / "out.jsonl"), "--no-progress"],
            capture_output=True, env=env, timeout=120,
        )
        for status in STATUSES:
            assert srv.count(outcome=status) >= 1, status
    err, out = proc.stderr.decode(), proc.stdout.decode()
    assert proc.returncode == 1, err
    assert "***" in err and "Traceback" not in err
    names = {p.name for p in work.iterdir()}
    assert {"out.jsonl.partial", "out.jsonl.summary.json", "out.jsonl.cache.sqlite"} <= names
    summary = json.loads((work / "out.jsonl.summary.json").read_text())
    assert summary["claims_failed"] == 4 and "***" in json.dumps(summary["failure_examples"])
    assert assert_no_key(work, texts=[out, err]) >= 4


# ---------------------------------------------------------------------------
# a secret typed on a command line: never in the line a run records or prints to resume with (real-train's:
# tests/test_train_guards.py)
# ---------------------------------------------------------------------------


def test_fae_runs_recorded_command_line_masks_a_secret_typed_on_it(tmp_path):
    """config.json's ``command`` is the `fae run` line as given (rerun it to resume), secrets masked: a key typed
    into --backend-args or a registered key never reaches the file."""
    import uuid

    from real_fae_core.cli import parse_command_line
    from real_fae_core.secrets import register_secret
    from fae.ablation.runner import FaeRunConfig, RunRequest, build_config
    from fae.backends.hf import HFBackend

    key = f"tok-{uuid.uuid4().hex}"
    register_secret(key)
    records = tmp_path / "r.jsonl"
    records.write_text("{}\n")
    argv = ["--records", str(records), "--output", "o", "--model", "m",
            "--backend-args", f"api_key=sk-typed-123,note={key}"]
    options, context = parse_command_line(FaeRunConfig, argv, "fae run")
    assert "sk-typed-123" not in context["command"] and key not in context["command"]
    assert context["command"].startswith("fae run --records") and "***" in context["command"]
    config = build_config(RunRequest(options, context["command"], None), HFBackend, {}, ["a"])
    assert "sk-typed-123" not in json.dumps(config["command"]) and key not in config["command"]
