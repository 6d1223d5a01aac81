"""The top-level handler, driven through real subprocesses: one table row per way a command can stop.

Each row is a command line, an optional local OpenAI-compatible server, an
optional signal sent mid-run, the expected exit code and fragments of the
expected stderr (docs/errors.md lists the codes). Every row also checks that
stderr holds no Python traceback unless ``--debug`` / ``REAL_FAE_DEBUG=1``
asked for one, and that the API key appears in no output file, no stdout and
no stderr.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from enhance_world import annotators_yaml, make_records, responder, write_records
from openai_server import LocalOpenAIServer

from data_prep.records import save_records
from helpers import interruptible, make_record_dict

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-CLIERR-LEAKCHECK-77aa11"
ENV = "ENHANCE_TEST_KEY"
REAL_DATA = [sys.executable, "-m", "data_prep.cli"]
FAE = [sys.executable, "-m", "fae.cli"]


@dataclass
class Row:
    id: str
    argv: list[str]  # {in}, {ann}, {out}, {verifier}, {url} are filled in per test
    code: int
    stderr: list[str]  # fragments (regular expressions) stderr must contain
    server: dict | None = None  # LocalOpenAIServer options
    send: int | None = None  # signal sent once the server has seen `after` requests
    after: int = 0
    env: dict = field(default_factory=dict)
    traceback: bool = False  # only --debug rows may print one
    claims: int = 4  # records given to enhance (the signal rows need a run long enough to interrupt)


def enhance_args(*extra):
    return ["enhance", "--records", "{in}", "--annotators", "{ann}", "--output", "{out}/out.jsonl",
            "--no-progress", *extra]


def fae_run_args():
    return ["run", "--backend", "openai", "--model", "verifier", "--base-url", "{url}", "--api-key-env", ENV,
            "--records", "{verifier}", "--output", "{out}/run", "--rounds", "1", "--max-retries", "1",
            "--backoff-base", "0.01", "--no-progress"]


def fae_pave_args():
    return ["pave", "--backend", "openai", "--model", "verifier", "--base-url", "{url}", "--api-key-env", ENV,
            "--records", "{verifier}", "--output", "{out}/pave", "--samples", "2", "--max-retries", "0",
            "--no-progress"]


RESUME = r"resume with: real-data enhance --records \S+ --output \S+out\.jsonl --annotators \S+ --no-progress"
ROWS = [
    Row("ctrl-c-enhance", REAL_DATA + enhance_args(), 130,
        [r"^real-data enhance: interrupted; kept (\d+) answers in the cache \S+out\.jsonl\.cache\.sqlite "
         r"and (\d+) finished claims in \S+out\.jsonl\.partial; " + RESUME],
        server={"latency": 0.2}, send=signal.SIGINT, after=12, claims=40),
    Row("sigterm-enhance", REAL_DATA + enhance_args(), 143,
        [r"^real-data enhance: terminated; kept (\d+) answers in the cache .*; " + RESUME],
        server={"latency": 0.2}, send=signal.SIGTERM, after=12, claims=40),
    Row("debug-flag-shows-traceback", REAL_DATA + ["enhance", "--records", "{out}/missing.jsonl", "--annotators",
                                                   "{ann}", "--output", "{out}/o.jsonl", "--debug"],
        1, [r"Traceback", r"UserError: \S+missing\.jsonl: records file not found"], traceback=True),
    Row("debug-env-shows-traceback", REAL_DATA + ["enhance", "--records", "{out}/missing.jsonl", "--annotators",
                                                  "{ann}", "--output", "{out}/o.jsonl"],
        1, [r"Traceback", r"UserError"], env={"REAL_FAE_DEBUG": "1"}, traceback=True),
    Row("bad-input-one-line", REAL_DATA + ["enhance", "--records", "{out}/missing.jsonl", "--annotators", "{ann}",
                                           "--output", "{out}/o.jsonl"],
        2, [r"^real-data enhance: error: \S+missing\.jsonl: records file not found$"]),
    Row("unknown-subcommand", REAL_DATA + ["frobnicate"], 2, [r"invalid choice: 'frobnicate'"]),
    Row("unknown-flag", FAE + ["run", "--frobnicate"], 2, [r"unrecognized arguments: --frobnicate"]),
    Row("unknown-enhance-flag", REAL_DATA + enhance_args("--frobnicate"), 2, [r"unrecognized arguments: --frobnicate"]),
    # the secrets rows: the server echoes the Authorization header in its error bodies
    Row("secret-enhance-401", REAL_DATA + enhance_args(), 1,
        [r"HTTP 401 from http://127\.0\.0\.1:\d+/v1 \(model 'ann-a'\)", r"\*\*\*"],
        server={"fault": "401", "echo_auth": True}),
    Row("secret-enhance-500", REAL_DATA + enhance_args(), 1,
        [r"http://127\.0\.0\.1:\d+/v1 \(model 'ann-\w'\): gave up after 5 attempts: InternalServerError", r"\*\*\*"],
        server={"fault": "500", "echo_auth": True}),
    Row("secret-fae-run-400", FAE + fae_run_args(), 1,
        [r"^fae run: error: .*HTTP 400.*\*\*\*.*rerun the same command to resume"],
        server={"fault": "400", "echo_auth": True}),
    Row("secret-fae-run-429", FAE + fae_run_args(), 1,
        [r"^fae run: error: .*still failing after 1 retries: HTTP 429.*\*\*\*"],
        server={"fault": "429", "echo_auth": True}),
    Row("secret-fae-pave-401", FAE + fae_pave_args(), 1,
        [r"^fae pave: error: .*HTTP 401.*\*\*\*.*rerun the same command to resume"],
        server={"fault": "401", "echo_auth": True}),
    Row("secret-fae-pave-500", FAE + fae_pave_args(), 1,
        [r"^fae pave: error: .*HTTP 500.*\*\*\*"],
        server={"fault": "500", "echo_auth": True}),
]


def _fill(argv, values):
    return [a.format(**values) if "{" in a else a for a in argv]


def _cached_answers(cache: Path) -> int:
    with sqlite3.connect(cache) as db:
        return db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_cli_row(row: Row, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    verifier = tmp_path / "verifier.jsonl"
    save_records([make_record_dict(id=f"r{k}", claim=f"Claim number {k} holds.") for k in range(3)], verifier)
    inp = write_records(tmp_path / "in.jsonl", make_records(row.claims, nei=False))
    env = {k: v for k, v in os.environ.items() if k != "REAL_FAE_DEBUG"}
    env.update(PYTHONPATH=str(REPO), **{ENV: KEY}, **row.env)
    srv = None
    if row.server is not None:
        opts = dict(row.server)
        fault = opts.pop("fault", None)
        srv = LocalOpenAIServer(responder=responder, api_key=KEY,
                                faults=(lambda b, a: fault) if fault else None, **opts).start()
    try:
        url = srv.base_url if srv else "http://127.0.0.1:9/v1"
        ann = annotators_yaml(tmp_path / "ann.yaml", url, env=ENV, concurrency=2, timeout=5, max_retries=4,
                              malformed_retries=0)
        cmd = _fill(row.argv, {"in": inp, "ann": ann, "out": out, "verifier": verifier, "url": url})
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                                preexec_fn=interruptible)
        if row.send is not None:
            deadline = time.monotonic() + 60
            while srv.count() < row.after:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the command made no progress"
                time.sleep(0.01)
            proc.send_signal(row.send)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if srv is not None:
            srv.stop()
    err, std = stderr.decode(), stdout.decode()
    assert proc.returncode == row.code, err
    for frag in row.stderr:
        assert re.search(frag, err, re.MULTILINE), f"{frag!r} not in stderr:\n{err}"
    if not row.traceback:
        assert "Traceback" not in err, err
    # the key: in no file written, nowhere printed
    assert "LEAKCHECK" not in err + std
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"LEAKCHECK" not in f.read_bytes(), f
    if row.send is not None:
        # what the note says was kept is what is on disk
        m = re.search(r"kept (\d+) answers in the cache (\S+) and (\d+) finished claims in (\S+);", err)
        answers, cache, claims, partial = int(m[1]), Path(m[2]), int(m[3]), Path(m[4])
        assert answers == _cached_answers(cache) and answers > 0
        assert claims == len(partial.read_text().splitlines())
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err  # one line, nothing else


class _Writes(__import__("io").RawIOBase):
    """A raw stream that keeps every write it is given, as the OS would see them."""

    def __init__(self):
        self.chunks: list[bytes] = []

    def writable(self):
        return True

    def write(self, b):
        self.chunks.append(bytes(b))
        return len(b)


def test_a_closing_line_reaches_stderr_in_one_write(monkeypatch):
    """The ranks of a launch share one stderr, and Python's stderr writes through to the file descriptor
    (``sys.stderr.buffer`` is a raw FileIO): a line written as text then newline in two writes ran into the
    other rank's line in CI; one write cannot."""
    import io

    from real_fae_core.entry import run_guarded
    from real_fae_core.errors import Terminated

    assert isinstance(sys.__stderr__.buffer, io.RawIOBase)  # what the stand-in below copies
    raw = _Writes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))

    def stopped(argv):
        raise Terminated()

    assert run_guarded("term-test", stopped, []) == 143
    assert raw.chunks == [b"term-test: terminated\n"]
