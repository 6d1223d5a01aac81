"""`real-data enhance` end to end against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from enhance_world import (
    EXPECTED,
    EXPECTED_ANNOTATIONS,
    EXPECTED_MIN1,
    MODELS,
    NAMES,
    NEI_INDEX,
    annotators_yaml,
    claim_index,
    expected_traffic,
    faults,
    make_records,
    responder,
    write_records,
)
from openai_server import LocalOpenAIServer

from data_prep.cli import main
from data_prep.enhance.prompt import annotation_check, render_annotator_prompt
from data_prep.records import ClaimRecord, load_records

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-0000"
N = 24


def _words(messages) -> int:  # the test server's usage = whitespace words of the messages
    return sum(len(m["content"].split()) for m in messages)


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    recs = make_records(N)
    inp = write_records(tmp_path / "in.jsonl", recs)
    srv = LocalOpenAIServer(responder=responder, faults=faults, slow_seconds=2.0, api_key=KEY).start()
    yield srv, recs, inp, annotators_yaml(tmp_path / "ann.yaml", srv.base_url), tmp_path
    srv.stop()


def _summary(out: Path) -> dict:
    return json.loads(out.with_name(out.name + ".summary.json").read_text())


def test_votes_exact_under_faults_and_second_run_sends_nothing(world, capsys):
    srv, recs, inp, ann, tmp = world
    out = tmp / "out.jsonl"
    args = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out), "--no-progress"]
    assert main(args) == 0

    # every fault kind really happened and was healed
    for outcome in ("429", "500", "timeout", "bad_content", "malformed_body", "disconnect"):
        assert srv.count(outcome=outcome) > 0, outcome
    # nothing lost: all records, input order, all fields kept, valid records
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in got] == [r["id"] for r in recs]
    assert len(load_records(out)) == N
    for k, r in enumerate(got):
        assert r["source_note"] == f"kept-{k}"
        if k == NEI_INDEX:
            assert r == recs[k]  # passed through untouched
            continue
        assert r["enhanced_evidence"] == EXPECTED[k % 4], k
        assert r["annotations"] == EXPECTED_ANNOTATIONS[k % 4], k
    assert not (tmp / "out.jsonl.partial").exists()

    # exactly the requests the retry policy implies, counted at the server
    claims = [k for k in range(N) if k != NEI_INDEX]
    s = _summary(out)
    for m in MODELS:
        traffic = [expected_traffic(k, m, malformed_retries=2) for k in claims]
        assert srv.count(model=m) == sum(t[0] for t in traffic), m
        a = s["annotators"][NAMES[m]]
        assert a["requests_made"] == srv.count(model=m)
        msgs = {k: render_annotator_prompt(ClaimRecord.from_dict(recs[k])) for k in claims}
        assert a["tokens_in"] == sum(_words(msgs[k]) * t[1] for k, t in zip(claims, traffic))
        assert a["tokens_out"] > 0
    assert s["requests"] == {"made": srv.count(), "served_from_cache": 0, "failed": 0}
    assert s["annotators"]["beta"]["invented_ids_dropped"] == sum(1 for k in claims if k % 4 == 0)
    assert s["annotators"]["beta"]["abstentions"] == sum(1 for k in claims if k % 4 == 2)
    assert s["annotators"]["alpha"]["abstentions"] == 0
    # alpha's picks vs gold {0}: per pattern (tp, picked) = (1,3), (0,0), (0,2), (0,1)
    n_pat = [sum(1 for k in claims if k % 4 == p) for p in range(4)]
    assert s["annotators"]["alpha"]["precision"] == pytest.approx(n_pat[0] / (3 * n_pat[0] + 2 * n_pat[2] + n_pat[3]))
    assert s["annotators"]["alpha"]["recall"] == pytest.approx(n_pat[0] / len(claims))
    assert s["claims_enhanced_differs_from_gold"] == len(claims) - n_pat[1]
    assert s["sentences_added"]["total"] == 2 * n_pat[0] + n_pat[2] + n_pat[3]
    printed = capsys.readouterr().out
    assert "requests:" in printed and "precision" in printed

    # second run: zero requests, identical output
    before, first = srv.count(), out.read_bytes()
    assert main(args) == 0
    assert srv.count() == before
    s2 = _summary(out)
    assert s2["requests"] == {"made": 0, "served_from_cache": 3 * len(claims), "failed": 0}
    assert s2["annotators"]["alpha"]["tokens_in_incl_cache"] == s["annotators"]["alpha"]["tokens_in_incl_cache"]
    assert out.read_bytes() == first

    # revote with another rule: no request, every pick of any annotator enters
    out2 = tmp / "min1.jsonl"
    assert main(["enhance", "--records", str(out), "--revote", "--min-votes", "1", "--output", str(out2)]) == 0
    assert srv.count() == before
    got2 = load_records(out2)
    for k, r in enumerate(got2):
        if k != NEI_INDEX:
            assert r.enhanced_evidence == EXPECTED_MIN1[k % 4]
    # revote with the default rule reproduces the original
    out3 = tmp / "again.jsonl"
    assert main(["enhance", "--records", str(out), "--revote", "--output", str(out3)]) == 0
    assert out3.read_bytes() == first


def test_dry_run_counts_and_sends_nothing(world, capsys):
    srv, recs, inp, ann, tmp = world
    out = tmp / "out.jsonl"
    base = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out)]
    assert main(base + ["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"{N - 1} claims x 3 annotators = {3 * (N - 1)} requests" in text
    assert f"{3 * (N - 1)} to send" in text and "input tokens" in text
    assert srv.count() == 0 and not out.exists() and not (tmp / "out.jsonl.cache.sqlite").exists()
    assert main(base + ["--no-progress"]) == 0
    capsys.readouterr()
    assert main(base + ["--dry-run"]) == 0
    assert f"({3 * (N - 1)} served from cache, 0 to send" in capsys.readouterr().out


def test_failed_requests_not_cached_exit_nonzero_and_rerun_retries_only_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    broken = {"on": True}

    def plan(body, attempt):  # gamma can never answer claim 2 while broken
        return "503" if broken["on"] and body["model"] == "ann-c" and claim_index(body) == 2 else None

    recs = make_records(10)
    inp = write_records(tmp_path / "in.jsonl", recs)
    out = tmp_path / "out.jsonl"
    with LocalOpenAIServer(responder=responder, faults=plan, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, max_retries=2)
        args = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out), "--no-progress"]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "gamma" in err and "503" in err and "Run the same command again" in err
        assert not out.exists()  # never a final file with a hole in it
        s = _summary(out)
        assert s["complete"] is False and s["failed_claim_ids"] == ["c2"]
        assert s["requests"]["failed"] == 1 and s["annotators"]["gamma"]["failed"] == 1
        assert srv.count(model="ann-c", outcome="503") == 3  # 1 + max_retries
        partial = [json.loads(x) for x in (tmp_path / "out.jsonl.partial").read_text().splitlines()]
        assert [r["id"] for r in partial] == [r["id"] for r in recs if r["id"] != "c2"]

        broken["on"] = False
        before = srv.count()
        assert main(args) == 0
        assert srv.count() - before == 1  # only gamma on claim 2
        assert [r.id for r in load_records(out)] == [r["id"] for r in recs]
        assert not (tmp_path / "out.jsonl.partial").exists()
        assert _summary(out)["complete"] is True


def test_api_key_never_written_or_logged(tmp_path):
    """A recognisable fake key: grep every file written and everything printed."""
    good, wrong = "sk-LEAKCHECK-123456", "sk-LEAKCHECK-WRONG-654321"

    def plan(body, attempt):  # a persistent 500 makes the error path print too
        return "500" if body["model"] == "ann-a" and claim_index(body) == 3 else None

    recs = make_records(8)
    inp = write_records(tmp_path / "in.jsonl", recs)
    work = tmp_path / "run"
    work.mkdir()
    with LocalOpenAIServer(responder=responder, faults=plan, api_key=good) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, max_retries=1,
                              envs={"ann-a": "LEAK_KEY", "ann-b": "LEAK_KEY", "ann-c": "WRONG_KEY"})
        env = dict(os.environ, LEAK_KEY=good, WRONG_KEY=wrong, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [sys.executable, "-m", "data_prep.cli", "enhance", "--records", str(inp), "--annotators", str(ann),
             "--output", str(work / "out.jsonl")],
            capture_output=True, env=env, timeout=60,
        )
        assert proc.returncode == 1, proc.stderr.decode()
        # the key was really used, and the wrong one was really rejected
        # beta: 7 claims, claim 2 malformed -> asked 1 + malformed_retries times
        assert srv.count(model="ann-b", outcome="ok") == 6 + 3
        assert any(r.authorization == f"Bearer {good}" for r in srv.log)
        assert 1 <= srv.count(model="ann-c") <= 4  # 401 stops gamma after what was in flight
    err = proc.stderr.decode()
    assert "401" in err and "WRONG_KEY" in err
    written = list(work.iterdir())
    assert {p.name for p in written} >= {"out.jsonl.partial", "out.jsonl.summary.json", "out.jsonl.cache.sqlite"}
    for blob in [proc.stdout, proc.stderr] + [p.read_bytes() for p in written if p.is_file()]:
        assert b"LEAKCHECK" not in blob


def test_missing_key_variable_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ENHANCE_TEST_KEY", raising=False)
    inp = write_records(tmp_path / "in.jsonl", make_records(3))
    ann = annotators_yaml(tmp_path / "ann.yaml", "http://127.0.0.1:9/v1")
    out = tmp_path / "o.jsonl"
    assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "annotator 'alpha'" in err and "ENHANCE_TEST_KEY" in err and "not set" in err
    assert "Traceback" not in err


def test_duplicate_claims_are_asked_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    recs = make_records(4, nei=False)
    twins = [dict(r, id=r["id"] + "-twin") for r in recs]  # same claim and pool, other ids
    inp = write_records(tmp_path / "in.jsonl", recs + twins)
    out = tmp_path / "out.jsonl"
    with LocalOpenAIServer(responder=responder, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, malformed_retries=0)
        base = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out)]
        assert main(base + ["--dry-run"]) == 0
        assert "12 to send" in capsys.readouterr().out
        assert main(base + ["--no-progress"]) == 0
        assert srv.count() == 12
    got = load_records(out)
    assert [r.enhanced_evidence for r in got[:4]] == [r.enhanced_evidence for r in got[4:]] == EXPECTED


def test_keyless_server_needs_no_key_variable_and_never_gets_openai_api_key(tmp_path, monkeypatch, capsys):
    """llama.cpp / vLLM without --api-key: no api_key_env in the file, and $OPENAI_API_KEY is never sent."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-LEAKCHECK")
    monkeypatch.delenv("ENHANCE_TEST_KEY", raising=False)
    inp = write_records(tmp_path / "in.jsonl", make_records(4, nei=False))
    out = tmp_path / "out.jsonl"
    with LocalOpenAIServer(responder=responder) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, env=None, malformed_retries=0)
        assert "api_key_env" not in ann.read_text()
        base = ["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out)]
        assert main(base + ["--dry-run"]) == 0
        assert "is not set" not in capsys.readouterr().out
        assert main(base + ["--no-progress"]) == 0
        assert srv.count() == 12
        assert {r.authorization for r in srv.log} == {"Bearer EMPTY"}
    assert [r.enhanced_evidence for r in load_records(out)] == EXPECTED


def test_connection_errors_name_the_endpoint_and_counts_add_up(tmp_path, monkeypatch, capsys):
    """Nothing listens: the error names base URL, model and the OS reason; annotated + failed = total."""
    import socket

    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    recs = make_records(8)  # 7 claims to annotate + 1 NOT_ENOUGH_INFO passed through
    inp = write_records(tmp_path / "in.jsonl", recs)
    ann = annotators_yaml(tmp_path / "ann.yaml", url, max_retries=1)
    out = tmp_path / "out.jsonl"
    assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out),
                 "--no-progress"]) == 1
    cap = capsys.readouterr()
    assert f"{url} (model 'ann-a'): gave up after 2 attempts: APIConnectionError: Connection error" in cap.err
    assert "Connection refused" in cap.err or "ConnectError" in cap.err
    assert KEY not in cap.err
    s = _summary(out)
    assert (s["claims_total"], s["claims_annotated"], s["claims_failed"], s["claims_passed_through_nei"]) == (7, 0, 7, 1)
    assert "claims: 7 to annotate = 0 annotated + 7 failed; 1 NOT_ENOUGH_INFO passed through" in cap.out


def test_counts_add_up_on_a_complete_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    inp = write_records(tmp_path / "in.jsonl", make_records(8))
    out = tmp_path / "out.jsonl"
    with LocalOpenAIServer(responder=responder, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, malformed_retries=0)
        assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out),
                     "--no-progress"]) == 0
    s = _summary(out)
    assert (s["claims_total"], s["claims_annotated"], s["claims_failed"]) == (7, 7, 0)
    assert "claims: 7 to annotate = 7 annotated + 0 failed; 1 NOT_ENOUGH_INFO passed through" in capsys.readouterr().out


@pytest.mark.parametrize("shared", ["output", "cache"])
def test_second_enhance_on_the_same_output_or_cache_stops_naming_the_holder(shared, tmp_path, monkeypatch, capsys):
    """A live holder of the output's or the cache's lock: the second run stops at once, sends nothing."""
    from real_fae_core.runlock import RunLock

    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    inp = write_records(tmp_path / "in.jsonl", make_records(4))
    cache = tmp_path / "shared.sqlite"
    held = tmp_path / "first.jsonl" if shared == "output" else cache
    with LocalOpenAIServer(responder=responder, api_key=KEY) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url)
        second_out = tmp_path / ("first.jsonl" if shared == "output" else "second.jsonl")
        with RunLock(held, "real-data enhance", is_dir=False):
            rc = main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(second_out),
                       "--cache", str(cache), "--no-progress"])
            err = capsys.readouterr().err
            assert rc == 2, err
            assert f"{held} is in use by real-data enhance (pid {os.getpid()}" in err
            assert srv.count() == 0 and not second_out.exists()
        # the holder is gone: the same command now runs
        assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(second_out),
                     "--cache", str(cache), "--no-progress"]) == 0


def test_retry_after_is_waited_and_counted_once_in_the_summary(tmp_path, monkeypatch):
    """429 + Retry-After: 1, then 200 (the shared policy, real_fae_core.openai_client)."""
    monkeypatch.setenv("ENHANCE_TEST_KEY", KEY)
    inp = write_records(tmp_path / "in.jsonl", make_records(1, nei=False))
    out = tmp_path / "out.jsonl"
    plan = lambda body, attempt: "429" if body["model"] == "ann-a" and attempt == 0 else None
    with LocalOpenAIServer(responder=responder, faults=plan, api_key=KEY, error_headers={"Retry-After": "1"}) as srv:
        ann = annotators_yaml(tmp_path / "ann.yaml", srv.base_url, max_retries=2)
        ann.write_text(ann.read_text().replace("backoff_max: 0.05", "backoff_max: 5"))  # the hint's cap
        assert main(["enhance", "--records", str(inp), "--annotators", str(ann), "--output", str(out),
                     "--no-progress"]) == 0
        first, second = [r for r in srv.log if r.model == "ann-a"]
    assert (first.outcome, second.outcome) == ("429", "ok") and second.at - first.at >= 1.0
    alpha = _summary(out)["annotators"]["alpha"]
    assert (alpha["requests_made"], alpha["transport_retries"], alpha["errors"]) == (2, 1, {"http_429": 1})
    assert _summary(out)["annotators"]["beta"]["transport_retries"] == 0


def _annotate(plan, max_retries=2):
    """One claim through an AnnotatorClient: (answer or the TransportFailure, stats, server outcomes)."""
    from data_prep.llm.client import AnnotatorClient, TransportFailure
    from data_prep.llm.config import AnnotatorConfig

    srv = LocalOpenAIServer(responder=responder, faults=plan, api_key=KEY, echo_auth=True).start()
    cfg = AnnotatorConfig(name="alpha", base_url=srv.base_url, model="ann-a", max_concurrency=1, temperature=0.0,
                          max_tokens=64, api_key_env="ENHANCE_TEST_KEY", timeout=5, max_retries=max_retries,
                          backoff_base=0.01, backoff_max=0.05)
    rec = ClaimRecord.from_dict(make_records(1, nei=False)[0])

    async def go():
        client = AnnotatorClient(cfg, KEY)
        try:
            pool = [s.id for s in rec.sentences]
            return await client.annotate(render_annotator_prompt(rec), pool, annotation_check(pool)), client.stats
        except TransportFailure as exc:
            return exc, client.stats
        finally:
            await client.close()

    try:
        got, stats = asyncio.run(go())
        return got, stats, [r.outcome for r in srv.log]
    finally:
        srv.stop()


def test_408_409_retried_400_not_and_exhausted_retries_give_a_clear_error():
    steps = {0: "408", 1: "409"}
    got, stats, log = _annotate(lambda b, a: steps.get(a))
    assert got.status == "ok" and log == ["408", "409", "ok"]
    assert stats.transport_retries == 2 and stats.errors == {"http_408": 1, "http_409": 1}
    got, stats, log = _annotate(lambda b, a: "400")
    assert log == ["400"] and stats.transport_retries == 0
    assert str(got).startswith("HTTP 400 from http://127.0.0.1:") and KEY not in str(got)
    got, stats, log = _annotate(lambda b, a: "429", max_retries=1)
    assert log == ["429", "429"] and stats.transport_retries == 1 and stats.errors == {"http_429": 2}
    assert "(model 'ann-a'): gave up after 2 attempts: RateLimitError: Error code: 429" in str(got)
    assert KEY not in str(got)
