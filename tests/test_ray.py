"""`fae run --executor ray --shards N` on a local Ray (2 CPUs): equal to one process, a lost worker re-run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import demo_verifier
import pytest
from fae_helpers import write_checkcovid
from openai_server import spawn

from fae.cli import main as fae_main
from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
# Never two of these at a time, nor beside another Ray run: a test kills the shard workers it finds by their
# process title, any Ray run's. The suite's --dist loadfile runs this file on one worker, in order, and no
# other file starts Ray.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def records(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "checkcovid.jsonl", n=20)


@pytest.fixture(scope="module")
def server_url():
    """A verifier server in its own process, slow enough (0.1 s an answer) to kill a task mid-shard."""
    srv, url = spawn("--latency", "0.1", "--role", "verifier")
    yield url
    srv.terminate()
    srv.wait(timeout=30)


def env(**extra):
    out = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    out.pop("RAY_ADDRESS", None)  # a local Ray for the test, whatever the machine has
    return out


def fae(records, out, url, *extra, **kw):
    cmd = [sys.executable, "-m", "fae.cli", "run", "--backend", "openai", "--model", "verifier",
           "--base-url", url, "--records", str(records), "--output", str(out), "--rounds", "3",
           "--no-progress", "--concurrency", "1", "--chunk-size", "1", *extra]
    return cmd if kw.get("cmd_only") else subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True,
                                                         text=True, timeout=300)


@pytest.fixture(scope="module")
def one_process(records, server_url, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    res = fae(records, out, server_url, "--concurrency", "8", "--chunk-size", "8")
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_ray_shards_equal_one_process_and_a_killed_worker_is_rerun(records, server_url, one_process, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(fae(records, out, server_url, "--executor", "ray", "--shards", "2", cmd_only=True),
                            cwd=REPO, env=env(), stderr=subprocess.PIPE, text=True)
    part = out / "shards" / "1-of-2" / "claims.jsonl"
    deadline = time.time() + 120
    while not (part.exists() and part.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    killed = worker_pids()
    assert killed, "no Ray worker running a shard"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)  # the worker process dies mid-shard, as on a lost node
    # a second writer of a shard the driver writes (what `fae run --shard 1/2` takes first) is refused;
    # in this process, so the check does not race the run
    with pytest.raises(UserError, match="1-of-2 is in use by fae run --executor ray"):
        RunLock(out / "shards" / "1-of-2", "fae run --shard 1/2", is_dir=True).acquire()
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0, err[-3000:]
    assert "lost its worker (WorkerCrashedError); resubmitted with its" in err
    for i in (0, 1):  # each claim written once, though a task ran twice
        ids = [c["id"] for c in lines(out / "shards" / f"{i}-of-2" / "claims.jsonl")]
        assert len(ids) == len(set(ids))
    assert lines(out / "claims.jsonl") == lines(one_process / "claims.jsonl")
    # the test server's verifier answers every round-1 pool (SUPPORT citing what is left, or NEI)
    demo_verifier.assert_ablated_rounds_generated(lines(out / "claims.jsonl"), per_claim=1, control_per_claim=0)
    config = json.loads((out / "config.json").read_text())
    assert config["shards"]["count"] == 2
    log = [json.loads(x) for x in (out / "shards" / "1-of-2" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["executor"] == "ray" and log[-1]["attempts"] == 2


@pytest.fixture(scope="module")
def demo_records(tmp_path_factory):
    return demo_verifier.write_records(tmp_path_factory.mktemp("demo") / "records.jsonl", 10)


def test_ray_hf_shards_equal_one_process_on_generated_ablated_rounds(demo_records, tmp_path):
    """hf in Ray workers: the demo's base model (tests/demo_verifier.py) answers validly at round 0 and
    finds another copy of its line each round, so the rounds the Ray run must equal were generated on
    ablated (and control) pools in the workers, not copied from round 0."""
    one, out = tmp_path / "one", tmp_path / "ray"
    assert fae_main(demo_verifier.fae_run_args(demo_records, one)) == 0
    cmd = [sys.executable, "-m", "fae.cli",
           *demo_verifier.fae_run_args(demo_records, out, "--executor", "ray", "--shards", "2")]
    res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got, want = lines(out / "claims.jsonl"), lines(one / "claims.jsonl")
    assert got == want  # labels, cited ids, raw outputs, control and gold-only answers of every round
    merged, single = ({k: v for k, v in json.loads((d / "metrics.json").read_text()).items()
                       if k != "computed_from"} for d in (out, one))
    assert merged == single
    demo_verifier.assert_ablated_rounds_generated(want)
    for i in (0, 1):  # each worker generated ablated rounds of its own claims
        demo_verifier.assert_ablated_rounds_generated(lines(out / "shards" / f"{i}-of-2" / "claims.jsonl"))
    log = [json.loads(x) for x in (out / "shards" / "0-of-2" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["executor"] == "ray"


def worker_pids() -> list[int]:
    """Processes whose title Ray set to the shard task's name."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().startswith(b"ray::_ablate_shard"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_a_backend_error_stops_the_ray_run_and_keeps_the_claims(records, tmp_path):
    res = fae(records, tmp_path / "run", "http://127.0.0.1:9/v1", "--executor", "ray", "--shards", "2",
              "--max-retries", "0")
    assert res.returncode == 1, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("fae run: error: shard ") and "rerun the same command to resume" in last, last
    assert not (tmp_path / "run" / "claims.jsonl").exists()


def test_executor_ray_without_ray_or_shards_is_one_line(records, tmp_path):
    blocker = tmp_path / "noray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('No module named ray')\n")
    cmd = fae(records, tmp_path / "run", "http://127.0.0.1:9/v1", "--executor", "ray", "--shards", "2",
              cmd_only=True)
    res = subprocess.run(cmd, cwd=REPO, env=env(PYTHONPATH=f"{blocker}:{REPO}"), capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip() == \
        "fae run: error: --executor ray needs Ray: pip install 'real-fae[ray]'", res.stderr
    res = fae(records, tmp_path / "run", "http://127.0.0.1:9/v1", "--executor", "ray")
    assert res.returncode == 2 and "needs --shards N" in res.stderr
    assert not (tmp_path / "run").exists()
