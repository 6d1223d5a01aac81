"""A fleet of OpenAI-compatible servers: streaming ablation, the per-claim routing key, vllm-router.

The fast tests run :func:`fae.ablation.streaming.run_ablation_streaming` against the
real HTTP server of tests/openai_server.py. The slow ones start two servers
(separate processes, each logging what reached it) behind a real
``vllm-router --policy consistent_hash`` and run ``fae run`` through it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from fae_helpers import write_checkcovid
from openai_server import LocalOpenAIServer, body_key, claim_of, stepwise_verifier

from data_prep.records import load_records
from fae.ablation import streaming
from fae.ablation.engine import ABLATION_ONLY, Arms, ablate, call_counts_of, run_ablation
from fae.ablation.runio import read_claims
from fae.backends import BackendError, Generation
from fae.backends.openai_backend import OpenAIBackend

SERVER = Path(__file__).resolve().parent / "openai_server.py"


@pytest.fixture(scope="module")
def records_file(shared_data, tmp_path_factory):
    # the sample data holds fewer (27): all of them
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("fleet") / "cc.jsonl", n=40)


def expected(path, rounds=4, arms=ABLATION_ONLY):
    """The claims a perfect transport yields: the same verifier, called in-process.

    The servers here run the stepwise verifier (one cited line per round), so
    claims need different numbers of model calls and finish out of order.
    """
    def generate(prompts, callback=None):
        return [Generation(stepwise_verifier({"messages": m}), "stop") for m in prompts]
    return {c["id"]: c for c in ablate(load_records(path), generate, rounds, arms)}


def backend(url, **opts):
    return OpenAIBackend({"model": "verifier", "base_url": url, "request_timeout": 5, "backoff_base": 0.01,
                          "label_probs": False, **opts})


def by_id(claims):
    return sorted(claims, key=lambda c: c["id"])


def test_streaming_rounds_equal_run_ablation_one_key_per_claim_bounded(records_file, monkeypatch):
    records = load_records(records_file)
    with LocalOpenAIServer(responder=stepwise_verifier) as srv:
        barrier: list[dict] = []
        run_ablation(records, backend(srv.base_url, concurrency=4), 4, barrier.extend, chunk_size=4,
                     progress=False, arms=Arms())
        assert {r.session for r in srv.log} == {None}  # generate() sends no routing key
        srv.reset_log()
        # writes flush every 3 claims here; at most 5 claims exist at once
        monkeypatch.setattr(streaming, "FLUSH_CLAIMS", 3)
        monkeypatch.setattr(streaming, "FLUSH_SECONDS", 1e9)
        writes: list[list[dict]] = []
        pulled_ahead = []

        def feed():
            for rec in records:  # an iterator, not a list: nothing read ahead of the window
                pulled_ahead.append(len(pulled_ahead) + 1 - sum(map(len, writes)))
                yield rec

        stats = streaming.run_ablation_streaming(feed(), backend(srv.base_url, concurrency=4), 4,
                                                 writes.append, run_name="run Ä", in_flight=5, progress=False,
                                                 arms=Arms())
        log = list(srv.log)
    got = [c for w in writes for c in w]
    # the control arm and gold-only pools too: the same questions whichever loop asks them
    assert by_id(got) == by_id(barrier) == by_id(expected(records_file, arms=Arms()).values())
    assert all("control" in c and "gold_only" in c and "cited_only" in c and "size_sweep" in c for c in got)
    assert [len(w) for w in writes[:-1]] == [3] * (len(writes) - 1) and 1 <= len(writes[-1]) <= 3
    assert max(pulled_ahead) <= 5 + 3  # in flight + finished but not yet flushed
    counts = [call_counts_of(c) for c in got]
    assert stats == {"claims": len(records), "model_calls": sum(n["model_calls"] for n in counts),
                     "reused_calls": sum(rd["reused"] for c in got for rd in c["rounds"]),
                     "control_calls": sum(n["control_calls"] for n in counts),
                     "sufficiency_calls": sum(n["sufficiency_calls"] for n in counts)}
    assert stats["model_calls"] + stats["control_calls"] + stats["sufficiency_calls"] == len(log)
    assert stats["control_calls"] > 0 and stats["sufficiency_calls"] > 0
    sessions = defaultdict(set)
    for r in log:
        sessions[r.claim].add(r.session)
    ids = {" ".join(rec.claim.split()): rec.id for rec in records}
    # the key is header-safe whatever the run's name
    assert all(s == {f"run%20%C3%84/{ids[claim]}"} for claim, s in sessions.items())
    assert len(sessions) == len(records)
    assert any(len({tuple(rd["pool_ids"]) for rd in c["rounds"]}) > 2 for c in got)  # several model rounds


def test_started_claims_go_first_so_rounds_follow_each_other(records_file):
    """One request at a time, every claim in flight: a claim's next round beats new claims to the slot,
    so each claim's rounds are asked back to back (while the server's prefix cache holds the last one)."""
    records = load_records(records_file)
    with LocalOpenAIServer(responder=stepwise_verifier) as srv:
        claims: list[dict] = []
        streaming.run_ablation_streaming(records, backend(srv.base_url, concurrency=1), 4, claims.extend,
                                         run_name="r", progress=False)
        order = [r.claim for r in srv.log]
    blocks = [c for k, c in enumerate(order) if k == 0 or order[k - 1] != c]
    assert len(blocks) == len(set(order)) == len(records)  # one contiguous block per claim
    assert len(order) > 2 * len(records)
    assert by_id(claims) == by_id(expected(records_file).values())


def test_a_refusal_learnt_while_requests_wait_is_applied_before_they_are_sent(records_file):
    """Every claim in flight has its request built; the first 400 on json_schema must still be the only one."""
    with LocalOpenAIServer(responder=stepwise_verifier, response_format_mode="json_object_only") as srv:
        b = backend(srv.base_url, concurrency=1, constrained_decoding=True, max_retries=0)
        streaming.run_ablation_streaming(load_records(records_file), b, 4, lambda claims: None, run_name="r",
                                         progress=False)
        kinds = [(r.response_format or {}).get("type") for r in srv.log]
    assert kinds[0] == "json_schema" and kinds.count("json_schema") == 1 and len(kinds) > 27
    assert b.stats["json_object_fallback"] == 1 and b.stats["retries"] == 0


def every_fault(body, attempt):
    kind = int(body_key(body), 16) % 6
    plan = {0: ["429"], 1: ["500", "503"], 2: ["timeout"], 3: ["malformed_body"], 4: ["disconnect"], 5: []}[kind]
    return plan[attempt] if attempt < len(plan) else None


def test_streaming_retries_every_fault_through_one_long_lived_client(records_file):
    """The streaming client (its own transport) sorts failures like generate(): retried, nothing lost."""
    with LocalOpenAIServer(responder=stepwise_verifier, faults=every_fault, slow_seconds=1.0) as srv:
        b = backend(srv.base_url, concurrency=8, request_timeout=0.4)
        claims: list[dict] = []
        streaming.run_ablation_streaming(load_records(records_file), b, 4, claims.extend, run_name="r",
                                         progress=False)
        outcomes = [r.outcome for r in srv.log]
        asked_again = len(srv.log) - len({r.key for r in srv.log})
    for fault in ("429", "500", "503", "timeout", "malformed_body", "disconnect"):
        assert fault in outcomes, fault
    assert by_id(claims) == by_id(expected(records_file).values())
    # every fault was retried; on a busy host an answer sent in time may still reach the client after its
    # 0.4 s timeout and be asked again, so the client's retries are the requests beyond each prompt's first
    assert sum(o != "ok" for o in outcomes) <= b.stats["retries"] == asked_again
    assert b.stats["requests"] == len(outcomes)


def test_streaming_failure_stops_with_backend_error_after_writing_finished_claims(records_file):
    records = load_records(records_file)
    doomed = " ".join(records[-1].claim.split())
    want = expected(records_file)
    with LocalOpenAIServer(responder=stepwise_verifier,
                           faults=lambda b, a: "500" if claim_of(b) == doomed else None) as srv:
        written: list[dict] = []
        with pytest.raises(BackendError, match=r"request for model 'verifier' still failing after 1 retries: "
                                               r"HTTP 500"):
            streaming.run_ablation_streaming(records, backend(srv.base_url, max_retries=1), 4, written.extend,
                                             run_name="r", in_flight=4, progress=False)
    assert written and all(c == want[c["id"]] for c in written)
    assert records[-1].id not in {c["id"] for c in written}


# ---------------------------------------------------------------------------
# two servers behind a real vllm-router
# ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process started for one test, ended by its own pid."""

    def __init__(self, args, ready):
        self.args = args
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        ready(self)

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=10)


def start_server(tmp: Path, name: str, port: int = 0, latency: float = 0.0) -> tuple[Proc, str, Path]:
    log = tmp / f"{name}.log"
    out = {}

    def ready(proc):
        line = proc.p.stdout.readline().split()
        assert line and line[0] == "READY", line
        out["url"] = line[1]

    proc = Proc([sys.executable, str(SERVER), "--fast", "--role", "stepwise", "--port", str(port), "--name", name,
                 "--log", str(log), "--latency", str(latency)], ready)
    return proc, out["url"].removesuffix("/v1"), log


def start_router(workers: list[str], *policy: str) -> tuple[Proc, str]:
    exe = shutil.which("vllm-router")
    if exe is None:
        pytest.skip("vllm-router is not installed (pip install 'real-fae[fleet]')")
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def ready(proc):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.p.poll() is None, proc.p.stdout.read()
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("vllm-router did not start")

    # the Prometheus exporter binds a fixed port unless told otherwise: two routers would collide
    proc = Proc([exe, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
                 "--log-level", "error", "--worker-urls", *workers, *policy], ready)
    return proc, url


def served(log: Path) -> dict[str, set]:
    """Claim text -> routing keys of the requests that reached this server."""
    out = defaultdict(set)
    for line in log.read_text().splitlines():
        row = json.loads(line)
        out[row["claim"]].add(row["session"])
    return out


def cached_share(run_dir: Path) -> float:
    """The share of prompt tokens the servers' prefix caches served, from the run log."""
    stats = json.loads((run_dir / "runs.jsonl").read_text().splitlines()[-1])["backend_stats"]
    return stats["cached_prompt_tokens"] / stats["prompt_tokens"]


def fae_run(records, out: Path, url: str, monkeypatch, *extra) -> int:
    """``fae run --backend openai`` in this process, with streaming ablation under the openai backend.

    The ablation's rounds alone (``--control none`` and no sufficiency arm): these tests measure how a router places
    a claim's rounds and what its prefix cache serves, which the extra questions would blur."""
    from fae.cli import main

    return main(["run", "--backend", "openai", "--model", "verifier", "--base-url", f"{url}/v1",
                 "--records", str(records), "--output", str(out), "--rounds", "4", "--concurrency", "8",
                 "--backoff-base", "0.05", "--request-timeout", "5", "--no-progress", "--control", "none",
                 "--no-gold-only", "--no-cited-only", "--no-size-sweep", *extra])


@pytest.mark.slow
def test_consistent_hash_router_keeps_each_claim_on_one_server(records_file, tmp_path, monkeypatch):
    procs = []
    try:
        (a, url_a, log_a), (b, url_b, log_b) = start_server(tmp_path, "a"), start_server(tmp_path, "b")
        procs += [a, b]
        router, url = start_router([url_a, url_b], "--policy", "consistent_hash")
        procs.append(router)
        assert fae_run(records_file, tmp_path / "routed", url, monkeypatch) == 0
        on_a, on_b = served(log_a), served(log_b)
        assert on_a and on_b and not set(on_a) & set(on_b)  # both used; no claim on both
        assert len(set(on_a) | set(on_b)) == len(load_records(records_file))
        assert all(len(keys) == 1 and next(iter(keys)).startswith("routed/")
                   for keys in [*on_a.values(), *on_b.values()])
        assert fae_run(records_file, tmp_path / "direct", url_a, monkeypatch) == 0
        assert (tmp_path / "routed" / "claims.jsonl").read_bytes() == \
            (tmp_path / "direct" / "claims.jsonl").read_bytes()
        # Without the key, consistent_hash hashes an empty key: every claim on one server.
        log_a.write_text(""), log_b.write_text("")
        assert fae_run(records_file, tmp_path / "nokey", url, monkeypatch, "--routing-header", "") == 0
        assert {len(served(log_a)), len(served(log_b))} == {0, len(load_records(records_file))}
        # The router's default policy (cache_aware) ignores the key and spreads a claim's rounds: fresh
        # servers (cold caches), and the prefix cache the run reports serves less of the prompts.
        for p in (router, a, b):
            p.kill()
        (a, url_a, log_a), (b, url_b, log_b) = start_server(tmp_path, "a2"), start_server(tmp_path, "b2")
        procs += [a, b]
        router, url = start_router([url_a, url_b])
        procs.append(router)
        assert fae_run(records_file, tmp_path / "default", url, monkeypatch) == 0
        split = set(served(log_a)) & set(served(log_b))
        assert split, "cache_aware kept every claim on one server"
        print(f"default policy: {len(split)} of {len(load_records(records_file))} claims had rounds on both servers")
        routed, spread = cached_share(tmp_path / "routed"), cached_share(tmp_path / "default")
        print(f"prompt share served by the prefix cache: consistent_hash {routed:.3f}, default policy {spread:.3f}")
        assert routed > spread > 0
    finally:
        for p in procs:
            p.kill()


@pytest.mark.slow
@pytest.mark.parametrize("router_retries", [True, False], ids=["router-retries", "router-no-retries"])
def test_a_server_killed_behind_the_router_mid_run_loses_nothing(records_file, tmp_path, monkeypatch,
                                                                router_retries):
    """The router retries on the live server itself; without its retries, ours take over (its 5xx)."""
    procs = []
    try:
        (a, url_a, log_a), (b, url_b, log_b) = (start_server(tmp_path, "a", latency=0.03),
                                                start_server(tmp_path, "b", latency=0.03))
        procs += [a, b]
        router, url = start_router([url_a, url_b], "--policy", "consistent_hash",
                                   *([] if router_retries else ["--disable-retries"]))
        procs.append(router)
        killed = threading.Event()

        def kill_b_after_some_requests():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if log_b.exists() and len(log_b.read_text().splitlines()) >= 10:
                    b.kill()
                    killed.set()
                    return
                time.sleep(0.01)

        t = threading.Thread(target=kill_b_after_some_requests, daemon=True)
        t.start()
        assert fae_run(records_file, tmp_path / "disturbed", url, monkeypatch) == 0
        t.join(timeout=5)
        assert killed.is_set() and b.p.poll() is not None
        claims = read_claims(tmp_path / "disturbed" / "claims.jsonl")
        assert claims == list(expected(records_file).values())  # every claim, the undisturbed answers
        stats = json.loads((tmp_path / "disturbed" / "runs.jsonl").read_text().splitlines()[-1])["backend_stats"]
        print(f"after the kill: {stats['retries']} retries ({stats['5xx']} 5xx from the router)")
        if not router_retries:
            assert stats["5xx"] >= 1 and stats["retries"] == stats["5xx"]
        moved = set(served(log_a)) & set(served(log_b))  # claims that were on b when it died
        assert moved and len(set(served(log_a)) | set(served(log_b))) == len(claims)
    finally:
        for p in procs:
            p.kill()


SHIM = """
import sys
from fae.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_sigterm_mid_run_keeps_finished_claims_and_the_rerun_completes(records_file, tmp_path, monkeypatch):
    """A kill lands inside the event loop: claims finished before it are on disk, the rest resume."""
    script = tmp_path / "fae_streaming.py"
    script.write_text(SHIM)
    out = tmp_path / "run"
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo}
    want = expected(records_file, arms=Arms())  # fae run's questions: rounds, controls, gold-only pools
    with LocalOpenAIServer(responder=stepwise_verifier, latency=0.05) as srv:
        args = ["run", "--backend", "openai", "--model", "verifier", "--base-url", srv.base_url,
                "--records", str(records_file), "--output", str(out), "--rounds", "4", "--concurrency", "4",
                "--no-progress"]
        p = subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30  # a few claims written, most still to do
        written = out / "claims.jsonl"
        while time.monotonic() < deadline and (srv.count() < 40 or not (written.exists() and written.read_text().strip())):
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 143, err
        partial = read_claims(out / "claims.jsonl")
        assert partial and len(partial) < len(want) and all(c == want[c["id"]] for c in partial)
        last = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
        assert last["error"] == "terminated (SIGTERM)" and last["claims"] == len(partial)
        p = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert f"{len(want) - len(partial)} claims to do ({len(partial)} already in" in p.stderr
    assert read_claims(out / "claims.jsonl") == list(want.values())


# ---------------------------------------------------------------------------
# benchmarks/scale.py's pass condition for the fleet
# ---------------------------------------------------------------------------


def scale_benchmark():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"
    spec = importlib.util.spec_from_file_location("scale_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fleet_result(scale, served, run_name="fleet-routed"):
    return {**scale.fleet_routing(served, run_name), "share_equal": 1.0}


def test_the_fleet_benchmark_fails_a_run_that_sent_no_routing_key():
    """Without the header consistent_hash sends every claim to one server: each claim is on one server,
    which the benchmark once took for a pass; it must fail, since nothing was routed by claim."""
    scale = scale_benchmark()
    claims = [f"claim {i}" for i in range(6)]
    keyed = [[{"session": f"fleet-routed/c{i}", "claim": c} for i, c in enumerate(claims) for _ in range(3)
              if i % 2 == k] for k in (0, 1)]
    assert scale.fleet_ok(fleet_result(scale, keyed))
    no_key = [[{"session": None, "claim": c} for c in claims for _ in range(3)], []]
    res = fleet_result(scale, no_key)
    assert res["claims_on_one_server_share"] == 1.0  # this share alone would pass: the routing-key share below fails it
    assert res["requests_with_routing_key_share"] == 0.0 and not scale.fleet_ok(res)
    # a key on every request but all claims on one server (the router ignored it), or a claim split
    one_server = [[r for rows in keyed for r in rows], []]
    assert not scale.fleet_ok(fleet_result(scale, one_server))
    split = [keyed[0] + keyed[1][:1], keyed[1]]
    assert not scale.fleet_ok(fleet_result(scale, split))
    assert not scale.fleet_ok({"skipped": "vllm-router is not installed"})


@pytest.mark.slow
def test_the_fleet_benchmark_run_without_the_header_fails(records_file, tmp_path):
    """benchmarks/scale.py's fleet path end to end, once with fae run's routing header and once with none."""
    if shutil.which("vllm-router") is None:
        pytest.skip("vllm-router is not installed (pip install 'real-fae[fleet]')")
    scale = scale_benchmark()
    (tmp_path / "with").mkdir(), (tmp_path / "without").mkdir()
    assert scale.fleet_ok(scale.fleet(records_file, tmp_path / "with", 4))
    res = scale.fleet(records_file, tmp_path / "without", 4, routing_header="")
    assert res["claims_on_one_server_share"] == 1.0 and not scale.fleet_ok(res)
