"""A real enhancer subprocess is SIGKILLed (then Ctrl-C'd) mid-run; resuming repeats nothing it had."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from enhance_world import (
    MODELS,
    NEI_INDEX,
    annotators_yaml,
    make_records,
    responder,
    write_records,
)
from helpers import interruptible
from openai_server import LocalOpenAIServer, body_key

from data_prep.cli import main
from data_prep.llm.cache import request_key
from data_prep.enhance.prompt import render_annotator_prompt
from data_prep.records import ClaimRecord

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-resume"
N = 60
CONCURRENCY = 2  # per annotator: at most 3 * 2 requests in flight


def _committed(cache: Path) -> set[str]:
    with sqlite3.connect(cache) as db:
        return {r[0] for r in db.execute("SELECT key FROM answers")}


def _wait_for(srv, n: int, proc, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while srv.count() < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "enhancer made no progress"
        time.sleep(0.005)


@pytest.mark.slow
def test_sigkill_and_ctrl_c_then_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    recs = make_records(N)
    inp = write_records(tmp_path / "in.jsonl", recs)
    claims = [ClaimRecord.from_dict(r) for k, r in enumerate(recs) if k != NEI_INDEX]
    total = 3 * len(claims)
    with LocalOpenAIServer(responder=responder, latency=0.05, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, concurrency=CONCURRENCY, timeout=5,
                              malformed_retries=0)  # one request per cache key
        # our cache key -> the server's identity of the same request
        to_server = {}
        for rec in claims:
            msgs = render_annotator_prompt(rec)
            for m in MODELS:
                to_server[request_key(m, msgs, {"temperature": 0.0, "max_tokens": 64})] = body_key(
                    {"model": m, "messages": msgs, "temperature": 0.0, "max_tokens": 64})
        out, cache = tmp_path / "out.jsonl", tmp_path / "answers.sqlite"
        args = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out),
                "--cache", str(cache), "--no-progress"]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-m", "data_prep.cli", *args]

        # 1. SIGKILL mid-run
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for(srv, total // 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        after_kill = srv.count()
        kept1 = _committed(cache)
        assert 0 < len(kept1) < total and not out.exists()
        partial = (tmp_path / "out.jsonl.partial").read_text().splitlines()
        assert all(json.loads(line)["annotations"] for line in partial)  # complete lines only

        # 2. resume, interrupted by Ctrl-C
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=interruptible)
        _wait_for(srv, after_kill + 30, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err.decode()
        assert b"interrupted; kept" in err and b"resume with: real-data enhance --records" in err
        after_int = srv.count()
        phase2 = {r.key for r in srv.log[after_kill:after_int]}
        assert not phase2 & {to_server[k] for k in kept1}, "an answer cached before the kill was requested again"
        kept2 = _committed(cache)
        assert kept1 < kept2 and len(kept2) < total

        # 3. resume to the end (in-process)
        assert main(args) == 0
        phase3 = [r.key for r in srv.log[after_int:]]
        assert len(phase3) == total - len(kept2)  # exactly what was missing, once each
        assert not set(phase3) & {to_server[k] for k in kept2}
        per_key = Counter(r.key for r in srv.log)
        assert set(per_key) == set(to_server.values())  # every request made
        repeats = sum(c - 1 for c in per_key.values())
        assert repeats <= 2 * 3 * CONCURRENCY  # only what was in flight at the two interruptions
        assert json.loads((tmp_path / "out.jsonl.summary.json").read_text())["requests"]["made"] == len(phase3)

        # 4. the same output as an uninterrupted run
        ref = tmp_path / "ref.jsonl"
        assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(ref),
                     "--no-progress"]) == 0
    assert out.read_bytes() == ref.read_bytes()
