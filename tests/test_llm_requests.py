"""The one cached LLM request (data_prep.llm.requests), through both commands that use it.

A real OpenAI-compatible server on 127.0.0.1 answers; ``real-data enhance``
and ``real-data counterfactual`` run as real subprocesses, are stopped by
SIGTERM mid-run and resumed: the resumed run asks exactly what was missing,
once each, and writes what an uninterrupted run writes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from enhance_world import annotators_yaml, make_records, responder, write_records
from openai_server import LocalOpenAIServer

from real_fae_core.errors import EXIT_TERMINATED
from data_prep.cli import main as real_data
from data_prep.enhance.prompt import annotation_check
from data_prep.llm.cache import AnswerCache
from data_prep.llm.client import AnnotatorClient
from data_prep.llm.config import load_annotators
from data_prep.llm.requests import RequestTable

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-llm-requests"
N = 40


def _field(body: dict, name: str) -> str | None:
    for line in body["messages"][-1]["content"].splitlines():
        if line.startswith(name + ": "):
            return line[len(name) + 2:]
    return None


def counterfactual_llm(body: dict) -> str:
    """Rewriter: the sentence plus a statement of the intended verdict; judge: reads that statement back."""
    claim = _field(body, "Claim")
    evidence = _field(body, "Evidence")
    if evidence is not None:  # the label-consistency judge
        label = "REFUTE" if f"false that {claim}" in evidence else "SUPPORT" if f"true that {claim}" in evidence \
            else "NOT_ENOUGH_INFO"
        return json.dumps({"label": label})
    truth = "false" if _field(body, "Intended verdict") == "REFUTE" else "true"
    return json.dumps({"sentence": f"{_field(body, 'Sentence')} Hence it is {truth} that {claim}"})


def _enhance_argv(inp: Path, ann: Path, out: Path, cache: Path) -> list[str]:
    return ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out), "--cache", str(cache),
            "--no-progress"]


def _counterfactual_argv(inp: Path, ann: Path, out: Path, cache: Path) -> list[str]:
    return ["counterfactual", "--records", str(inp), "--annotators", str(ann), "--output", str(out),
            "--cache", str(cache), "--kinds", "semantic", "--no-progress"]


def _counterfactual_yaml(path: Path, url: str) -> Path:
    # temperature > 0: every request carries its derived seed, through the interruption too
    path.write_text(f"annotators:\n  - name: writer\n    base_url: {url}\n    model: writer-1\n"
                    "    api_key_env: ENHANCE_TEST_KEY\n"
                    "    max_concurrency: 2\n    temperature: 0.7\n    max_tokens: 200\n    malformed_retries: 0\n")
    return path


COMMANDS = {
    "enhance": (responder, lambda p, url: annotators_yaml(p, url, concurrency=2, timeout=5, malformed_retries=0),
                _enhance_argv),
    "counterfactual": (counterfactual_llm, _counterfactual_yaml, _counterfactual_argv),
}


def _answers(cache: Path) -> int:
    with sqlite3.connect(cache) as db:
        return db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigterm_keeps_finished_answers_and_the_resumed_run_asks_only_the_rest(command, tmp_path, monkeypatch):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    respond, write_yaml, argv_of = COMMANDS[command]
    inp = write_records(tmp_path / "in.jsonl", make_records(N))
    out, cache = tmp_path / "out.jsonl", tmp_path / "answers.sqlite"
    with LocalOpenAIServer(responder=respond, latency=0.05, api_key=KEY) as srv:
        ann = write_yaml(tmp_path / "ann.yaml", srv.base_url)
        argv = argv_of(inp, ann, out, cache)
        proc = subprocess.Popen([sys.executable, "-m", "data_prep.cli", *argv],
                                env=dict(os.environ, PYTHONPATH=str(REPO)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300  # a loaded machine starts a Python process slowly
        while srv.count() < 12:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{command} made no progress"
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_TERMINATED, err.decode()
        kept = _answers(cache)
        assert f"terminated; kept {kept} answers in the cache {cache}".encode() in err, err.decode()
        assert f"resume with: real-data {command} --records".encode() in err
        assert kept > 0 and not out.exists()
        before = srv.count()

        assert real_data(argv) == 0  # resumed
        resumed = srv.log[before:]
        summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
        assert summary["complete"] and summary["requests"]["made"] == len(resumed)

        srv.reset_log()
        ref = tmp_path / "ref.jsonl"
        assert real_data(argv_of(inp, ann, ref, tmp_path / "ref.sqlite")) == 0  # uninterrupted, fresh cache
        total = srv.count()
        # what was answered before SIGTERM is never asked again; what was missing is asked once
        assert len(resumed) == total - kept
        assert len({r.key for r in resumed}) == len(resumed)
        assert {r.key for r in resumed} <= {r.key for r in srv.log}  # same requests (and seeds) as a straight run
    assert out.read_bytes() == ref.read_bytes()


def test_identical_requests_share_one_flight_and_finished_ones_leave_the_table(tmp_path):
    """Three identical requests in flight at once send one HTTP request; a finished request, answered or
    failed, leaves the in-flight table, so a failure is retried by the next identical request."""
    fail_once = {"Claim: will fail first"}

    def faults(body, attempt):
        return "500" if body["messages"][-1]["content"] in fail_once and attempt == 0 else None

    with LocalOpenAIServer(responder=lambda body: json.dumps({"evidence": [0]}), faults=faults,
                           latency=0.2) as srv:
        (tmp_path / "ann.yaml").write_text(
            f"annotators:\n  - name: solo\n    base_url: {srv.base_url}\n    model: m-1\n    max_concurrency: 4\n"
            "    temperature: 0.0\n    max_tokens: 16\n    max_retries: 0\n")
        cfg = load_annotators(tmp_path / "ann.yaml")[0]
        cache = AnswerCache(tmp_path / "cache.sqlite")

        async def scenario():
            client = AnnotatorClient(cfg, cfg.api_key())
            stats = client.stats
            table = RequestTable(cache, "test")

            def ask(key, content):
                msgs = [{"role": "user", "content": content}]
                return table.ask(key, cfg.model, lambda: client.annotate(msgs, [0], annotation_check([0])), stats, cfg.name)

            try:
                tasks = [asyncio.ensure_future(ask("same", "Claim: asked three times")) for _ in range(3)]
                await asyncio.sleep(0)  # every task is now waiting on the request under way
                assert list(table.inflight) == ["same"]
                answers = await asyncio.gather(*tasks)
                assert table.inflight == {}
                assert [a.content for a in answers] == [json.dumps({"evidence": [0]})] * 3
                assert (stats.requests, stats.answered, stats.from_cache) == (1, 1, 2)
                assert stats.tokens_in_all == 3 * answers[0].prompt_tokens > 0

                failed = await ask("flaky", "Claim: will fail first")
                assert isinstance(failed, str) and failed.startswith("solo: ")
                assert table.inflight == {} and cache.get("flaky") is None and stats.failed == 1
                again = await ask("flaky", "Claim: will fail first")  # asked again, not the remembered failure
                assert again.content == json.dumps({"evidence": [0]}) and cache.get("flaky") is not None
                assert await ask("flaky", "Claim: will fail first") == again  # now from the cache
                assert stats.requests == 3 and stats.from_cache == 3
            finally:
                await client.close()

        try:
            asyncio.run(scenario())
        finally:
            cache.close()
        assert srv.count() == 3
