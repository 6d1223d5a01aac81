"""The openai backend against a real HTTP server on 127.0.0.1 that injects faults."""

import json
from pathlib import Path

import pytest
from fae_helpers import write_checkcovid
from openai_server import LocalOpenAIServer, body_key, claim_of, overlap_verifier

from data_prep.records import load_records
from fae.ablation.engine import Arms, ablate, call_counts_of
from fae.ablation.metrics import compute_metrics
from fae.ablation.runio import read_claims
from fae.backends import Generation
from fae.cli import main

KEY = "sk-fae-TEST-4f1c9e-do-not-leak"
ENV = "FAE_TEST_OPENAI_KEY"


@pytest.fixture(scope="module")
def records_file(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "cc.jsonl", n=12)


def expected_claims(path, rounds):
    """What a perfect transport yields: the same verifier, called in-process (fae run's arms: control, gold-only)."""
    def generate(prompts, callback=None):  # the server says finish_reason "stop"
        return [Generation(overlap_verifier({"messages": m}), "stop") for m in prompts]
    return ablate(load_records(path), generate, rounds, Arms())


def fae_run(records, out, base_url, *extra):
    return main(["run", "--backend", "openai", "--model", "verifier", "--base-url", base_url,
                 "--api-key-env", ENV, "--records", str(records), "--output", str(out), "--rounds", "4",
                 "--concurrency", "4", "--request-timeout", "0.4", "--backoff-base", "0.01",
                 "--no-progress", *extra])


def every_fault(body, attempt):
    """Deterministic by prompt: 429, 500 then 503, timeout, malformed body, dropped connection."""
    kind = int(body_key(body), 16) % 6
    plan = {0: ["429"], 1: ["500", "503"], 2: ["timeout"], 3: ["malformed_body"], 4: ["disconnect"], 5: []}[kind]
    return plan[attempt] if attempt < len(plan) else None


def assert_key_never_written(run_dir: Path, *texts):
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    for t in texts:
        assert KEY not in t


def test_faults_are_retried_nothing_lost_key_never_stored(records_file, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, KEY)
    out = tmp_path / "run"
    # a timeout well above an answer's time: on a busy host an answer sent in time must not miss it (then it
    # would be asked again, and counted twice below)
    with LocalOpenAIServer(faults=every_fault, api_key=KEY, slow_seconds=2.5) as srv:
        assert fae_run(records_file, out, srv.base_url, "--request-timeout", "1.0") == 0
        outcomes = [r.outcome for r in srv.log]
    for fault in ("429", "500", "503", "timeout", "malformed_body", "disconnect", "ok"):
        assert fault in outcomes, fault
    claims = read_claims(out / "claims.jsonl")
    assert claims == expected_claims(records_file, 4)  # every claim once, in order, same answers
    assert any(len(set(r["pool_ids"])) < len(set(c["rounds"][0]["pool_ids"]))
               for c in claims for r in c["rounds"])  # evidence really got ablated
    log = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    stats = log[-1]["backend_stats"]
    n_faults = sum(o != "ok" for o in outcomes)
    assert stats["retries"] == n_faults and stats["requests"] == len(outcomes)
    assert stats["malformed"] >= 1 and stats["timeout"] >= 1 and stats["429"] >= 1 and stats["5xx"] >= 2
    m = compute_metrics(claims)  # every question answered once: the rounds, their controls, the sufficiency pools
    assert srv.count(outcome="ok") == m["model_calls"] + sum(call_counts_of(c)["control_calls"]
                                                             + call_counts_of(c)["sufficiency_calls"] for c in claims)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["settings"]["api_key_env"] == ENV and cfg["backend"] == "openai"
    captured = capfd.readouterr()
    assert_key_never_written(out, captured.out, captured.err)


def test_a_request_failing_for_good_stops_cleanly_and_the_rerun_resumes(records_file, tmp_path, monkeypatch,
                                                                       capfd):
    monkeypatch.setenv(ENV, KEY)
    records = load_records(records_file)
    doomed = records[-1].claim  # the longest prompt: last into the window
    out = tmp_path / "run"
    with LocalOpenAIServer(faults=lambda b, a: "500" if claim_of(b) == " ".join(doomed.split()) else None,
                           api_key=KEY) as srv:
        rc = fae_run(records_file, out, srv.base_url, "--chunk-size", "2", "--max-retries", "2")
    err = capfd.readouterr().err
    assert rc == 1
    assert "still failing after 2 retries" in err and "rerun the same command to resume" in err
    partial = read_claims(out / "claims.jsonl")
    expected = {c["id"]: c for c in expected_claims(records_file, 4)}
    assert partial and all(c == expected[c["id"]] for c in partial)  # finished claims kept, as they are
    assert records[-1].id not in {c["id"] for c in partial}  # no fake answer for the failing claim
    assert not (out / "metrics.json").exists()
    with LocalOpenAIServer(api_key=KEY) as srv:
        assert fae_run(records_file, out, srv.base_url, "--chunk-size", "2", "--max-retries", "2") == 0
    claims = read_claims(out / "claims.jsonl")
    assert claims == expected_claims(records_file, 4)
    assert json.loads((out / "metrics.json").read_text())["n_claims"] == len(records)
    captured = capfd.readouterr()
    assert_key_never_written(out, err, captured.out, captured.err)


def test_wrong_key_fails_fast_without_retries_and_missing_env_is_clear(records_file, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, "sk-wrong")
    with LocalOpenAIServer(api_key=KEY) as srv:
        assert fae_run(records_file, tmp_path / "a", srv.base_url) == 1
        assert srv.log and all(r.attempt == 0 for r in srv.log)  # a 401 is never retried
    assert "HTTP 401" in capfd.readouterr().err
    assert not (tmp_path / "a" / "claims.jsonl").read_text()
    # nothing finished yet, so the directory may be reused with other settings
    monkeypatch.setenv(ENV, KEY)
    with LocalOpenAIServer(api_key=KEY) as srv:
        assert fae_run(records_file, tmp_path / "a", srv.base_url, "--rounds", "1", "--limit", "3") == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["rounds"] == 1
    monkeypatch.delenv(ENV)
    assert fae_run(records_file, tmp_path / "b", "http://127.0.0.1:9/v1") == 2
    assert f"environment variable {ENV}" in capfd.readouterr().err


def test_limit_grows_and_a_smaller_limit_is_refused(records_file, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(ENV, KEY)
    out = tmp_path / "run"
    with LocalOpenAIServer(api_key=KEY) as srv:
        assert fae_run(records_file, out, srv.base_url, "--limit", "3") == 0
        assert fae_run(records_file, out, srv.base_url) == 0
        assert "9 claims to do (3 already in" in capfd.readouterr().err
        calls = len(srv.log)
        # shrinking the claim set of a finished run is refused: it would leave 12 claims
        # in claims.jsonl under metrics over 5 (docs/runs.md)
        assert fae_run(records_file, out, srv.base_url, "--limit", "5") == 2
        assert "claim set: 12 claims -> 5 claims" in capfd.readouterr().err
        assert len(srv.log) == calls  # nothing asked
    assert len(read_claims(out / "claims.jsonl")) == 12
    assert json.loads((out / "metrics.json").read_text())["n_claims"] == 12


def test_connection_error_names_endpoint_model_and_reason(tmp_path, monkeypatch):
    """Nothing listens at the base URL: the error says where, for which model, and why; never the key."""
    import socket

    from fae.backends import BackendError
    from fae.backends.openai_backend import OpenAIBackend

    monkeypatch.setenv(ENV, KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    backend = OpenAIBackend({"model": "verifier", "base_url": url, "api_key_env": ENV, "max_retries": 0,
                             "request_timeout": 2})
    with pytest.raises(BackendError) as info:
        backend.generate([[{"role": "user", "content": "Claim: x"}]])
    msg = str(info.value)
    assert msg.startswith(f"{url}: request for model 'verifier' still failing after 0 retries")
    assert "APIConnectionError: Connection error. (" in msg and "ConnectError" in msg
    assert KEY not in msg and KEY not in repr(backend)


def _backend(url, monkeypatch, **opts):
    from fae.backends.openai_backend import OpenAIBackend

    monkeypatch.setenv(ENV, KEY)
    return OpenAIBackend({"model": "verifier", "base_url": url, "api_key_env": ENV, "request_timeout": 5,
                          "backoff_base": 0.01, "label_probs": False, **opts})


PROMPT = [{"role": "user", "content": "Claim: the red fox jumps\nDocument:\nline0: a red fox jumps high"}]


def test_429_retry_after_is_waited_and_counted_once(monkeypatch):
    """The shared policy (real_fae_core.openai_client): the server's hint, not the 0.01 s backoff."""
    with LocalOpenAIServer(faults=lambda b, a: "429" if a == 0 else None, error_headers={"Retry-After": "1"},
                           api_key=KEY) as srv:
        backend = _backend(srv.base_url, monkeypatch, max_retries=2)
        [answer] = backend.generate([PROMPT])
        first, second = srv.log
    assert json.loads(answer.text)["label"] == "SUPPORT"
    assert second.at - first.at >= 1.0
    assert backend.stats["retries"] == 1 and backend.stats["429"] == 1 and backend.stats["requests"] == 2


def test_408_409_retried_400_not_and_exhaustion_is_one_clear_error(monkeypatch):
    from fae.backends import BackendError

    plan = {0: "408", 1: "409"}
    with LocalOpenAIServer(faults=lambda b, a: plan.get(a), api_key=KEY) as srv:
        backend = _backend(srv.base_url, monkeypatch, max_retries=2)
        backend.generate([PROMPT])
        assert [r.outcome for r in srv.log] == ["408", "409", "ok"]
    assert backend.stats["retries"] == 2 and backend.stats["408"] == 1 and backend.stats["409"] == 1
    with LocalOpenAIServer(faults=lambda b, a: "400", api_key=KEY, echo_auth=True) as srv:
        backend = _backend(srv.base_url, monkeypatch, max_retries=2)
        with pytest.raises(BackendError, match=r"request for model 'verifier' failed: HTTP 400") as info:
            backend.generate([PROMPT])
        assert srv.count() == 1 and backend.stats["retries"] == 0
    assert KEY not in str(info.value)
    with LocalOpenAIServer(faults=lambda b, a: "409", api_key=KEY, echo_auth=True) as srv:
        backend = _backend(srv.base_url, monkeypatch, max_retries=1)
        with pytest.raises(BackendError, match=r"still failing after 1 retries: HTTP 409") as info:
            backend.generate([PROMPT])
        assert srv.count() == 2
    assert KEY not in str(info.value)
