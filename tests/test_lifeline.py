"""Launched ranks leave within seconds: a rank stuck at exit, or outliving a sibling that exited, is ended
with its stacks and one line (real_fae_core/lifeline.py), under a real `accelerate launch` of two CPU processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO, free_port, make_record_dict, tagged_processes

from data_prep.cli import main as real_data

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds sibling ranks through /proc")]


def _launch(script_or_module: list[str], tag: str, extra_env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [ACCELERATE, "launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "--main_process_port", str(free_port()), *script_or_module]
    started = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env={**ENV, "REAL_TEST_TAG": tag, **extra_env}, capture_output=True,
                       text=True, timeout=timeout)
    return p, time.monotonic() - started


def _none_left(tag: str, seconds: float = 10) -> list[int]:
    deadline = time.time() + seconds
    while (left := tagged_processes(tag)) and time.time() < deadline:
        time.sleep(0.2)
    return left


def test_a_rank_that_outlives_an_exited_sibling_is_ended_with_one_line(tmp_path):
    """Rank 0 exits 0; rank 1 blocks for ever (in a futex, as the ranks of the exit hang did). torch elastic
    would wait for it without end; its peer watch ends it after the grace period, naming what it was doing."""
    script = tmp_path / "stuck_rank.py"
    script.write_text(textwrap.dedent("""
        import os, threading
        from real_fae_core.lifeline import die_with_launcher, leave, set_stage, watch_peers
        die_with_launcher()
        assert watch_peers("stuck-test")
        if os.environ["RANK"] == "1":
            set_stage("waiting for a lock nobody releases")
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        leave("stuck-test", 0)
    """))
    tag = uuid.uuid4().hex
    p, took = _launch([str(script)], tag, {"PYTHONPATH": str(REPO), "REAL_TRAIN_PEER_GRACE": "3"}, timeout=240)
    assert p.returncode == 1, p.stderr[-3000:]  # the launcher reports rank 1's failure, and returns
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("stuck-test: rank")]
    assert "stuck-test: rank 0 of 2: exited cleanly (exit code 0" in "\n".join(lines), p.stderr[-3000:]
    ended = [ln for ln in lines if ln.startswith("stuck-test: rank 1 of 2: ended:")]
    assert len(ended) == 1, p.stderr[-3000:]
    m = re.match(r"stuck-test: rank 1 of 2: ended: rank 0 exited (\d+) s ago and this rank was still "
                 r"waiting for a lock nobody releases \(its threads' stacks are above", ended[0])
    assert m and 3 <= int(m.group(1)) <= 10, ended[0]
    assert re.search(r'File ".*stuck_rank\.py", line 10 in <module>', p.stderr)  # the stuck thread: lock.acquire()
    assert _none_left(tag) == []
    assert took < 150, f"the launcher took {took:.0f} s to return"


def _tiny_pairs(tmp_path, tiny_llama) -> Path:
    recs = tmp_path / "train.jsonl"
    pool = [{"id": 0, "text": "The vaccine reduces the risk of severe disease.", "doc": "V"},
            {"id": 9, "text": "The study found no significant effect.", "doc": "S"}]
    recs.write_text("".join(json.dumps(make_record_dict(id=f"t{i}", label="SUPPORT" if i % 2 else "REFUTE",
                                                         sentences=pool, evidence=[[0]] if i % 2 else [[9]]))
                            + "\n" for i in range(4)))
    assert real_data(["pairs", "--records", str(recs), "--variant", "no_enhancement", "--output",
                      str(tmp_path / "pairs"), "--tokenizer", str(tiny_llama)]) == 0
    return tmp_path / "pairs"


def test_a_rank_stuck_at_exit_after_training_is_ended_and_the_adapter_is_whole(tiny_llama, tmp_path):
    """A real two-process training whose rank 1 blocks in an atexit handler (code outside ours: a tracker, a
    library) after the run is saved: the rank is ended after REAL_TRAIN_EXIT_SECONDS with one line, rank 0
    exits cleanly, the saved adapter is complete, no process is left."""
    _tiny_pairs(tmp_path, tiny_llama)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import atexit, os, threading
        if os.environ.get("RANK") == "1" and os.environ.get("REAL_TEST_HANG_AT_EXIT") == "1":
            atexit.register(lambda: threading.Event().wait())
    """))
    out, tag = tmp_path / "out", uuid.uuid4().hex
    args = ["-m", "real.train", "--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"),
            "--model_name_or_path", str(tiny_llama), "--dataset_name", str(tmp_path / "pairs"),
            "--variant", "no_enhancement", "--output_dir", str(out), "--max_steps", "2",
            "--per_device_train_batch_size", "1", "--global_batch_size", "2", "--save_strategy", "no"]
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "REAL_TEST_HANG_AT_EXIT": "1",
           "REAL_TRAIN_EXIT_SECONDS": "4"}
    p, _ = _launch(args, tag, env, timeout=480)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "real-train: rank 0 of 2: exited cleanly (exit code 0" in p.stderr, p.stderr[-3000:]
    ended = [ln for ln in p.stderr.splitlines() if ln.startswith("real-train: rank 1 of 2: ended:")]
    assert ended == ["real-train: rank 1 of 2: ended: still exiting: running the atexit handlers 4 s after its "
                     "work finished (its threads' stacks are above; REAL_TRAIN_EXIT_SECONDS sets this limit)"], \
        p.stderr[-3000:]
    assert re.search(r'File ".*sitecustomize\.py", line \d+ in <lambda>', p.stderr)  # the stuck thread's stack
    assert "real-train: rank 1 of 2: exited" not in p.stderr
    assert (out / "adapter_model.safetensors").is_file() and (out / "run_fingerprint.json").is_file()
    assert _none_left(tag) == []


SIGTERM_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from real_fae_core.entry import run_guarded, set_interrupt_note
from real_fae_core.lifeline import sibling_ranks, answer_sigterm, die_with_launcher, leave, set_stage, watch_peers
late = os.environ["RANK"] == "1" and os.environ["REAL_TEST_MODE"] == "late"
if late:  # blocked in every thread started from here on: the SIGTERM stays pending until unblocked below
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
die_with_launcher()
watch_peers("term-test")
assert answer_sigterm("term-test")

def body(argv):
    set_interrupt_note("kept checkpoint out/checkpoint-4 (step 4); resume with: the same command")
    Path(os.environ["REAL_TEST_READY"] + os.environ["RANK"]).write_text("ready")
    if os.environ["RANK"] == "1" and os.environ["REAL_TEST_MODE"] == "kill":
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    if late:  # takes its SIGTERM only once the stopped rank 0 has left (a busy core, a long C++ call)
        while sibling_ranks(os.getppid()):
            time.sleep(0.05)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    set_stage("waiting in a collective that never returns")
    while True:
        time.sleep(600)

leave("term-test", run_guarded("term-test", body))
"""


def _sigterm_launch(tmp_path, mode: str, grace: str) -> tuple[subprocess.Popen, str, Path]:
    script = tmp_path / "term_rank.py"
    script.write_text(SIGTERM_SCRIPT)
    tag, ready = uuid.uuid4().hex, tmp_path / "ready-"
    cmd = [ACCELERATE, "launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "--main_process_port", str(free_port()), str(script)]
    log = tmp_path / "launch.log"
    with log.open("w") as fh:
        launcher = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env={
            **ENV, "REAL_TEST_TAG": tag, "PYTHONPATH": str(REPO), "REAL_TEST_MODE": mode,
            "REAL_TEST_READY": str(ready), "REAL_TRAIN_TERM_SECONDS": grace})
    deadline = time.time() + 120
    while not all(Path(f"{ready}{r}").exists() for r in (0, 1)):
        assert launcher.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    return launcher, tag, log


def _wait_then_clean_up(launcher: subprocess.Popen, tag: str, timeout: float, signal_first: bool = False) -> None:
    """Wait for the launch to end (after SIGTERM if asked); whatever is still running afterwards is killed."""
    try:
        if signal_first:
            launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in tagged_processes(tag):
            os.kill(pid, 9)


def test_a_rank_whose_sibling_was_killed_says_so_even_when_sigterm_comes_first(tmp_path):
    """Rank 1 is SIGKILLed; torch elastic SIGTERMs rank 0, which here never gets an error of its own (a
    collective blocked in C++). SIGTERM's default action would end it without a word; it is ended
    REAL_TRAIN_TERM_SECONDS later with the line that names the lost peer and the checkpoint kept."""
    launcher, tag, log = _sigterm_launch(tmp_path, "kill", grace="3")
    _wait_then_clean_up(launcher, tag, timeout=90)
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("term-test: rank 0 of 2:")]
    assert lines == ["term-test: rank 0 of 2: error: another process of this run stopped while this rank was "
                     "waiting in a collective that never returns; see its error; kept checkpoint "
                     "out/checkpoint-4 (step 4); resume with: the same command"], text[-3000:]
    assert re.search(r"exitcode\s*:\s*1 \(pid", text), text[-3000:]  # rank 0 exits 1, not -15 (SIGTERM)
    assert launcher.returncode != 0
    assert _none_left(tag) == []


@pytest.mark.parametrize("mode", ["stop", "late"])
def test_a_launch_stopped_with_sigterm_ends_every_rank_with_the_interrupt_note(tmp_path, mode):
    """SIGTERM to the launcher (a scheduler stopping the job): each rank, busy in Python, raises Terminated
    at once and says what is kept, instead of dying silently; nothing is left running.

    "late": torch elastic sends SIGTERM to the ranks a moment apart, and rank 0 stops and leaves before
    rank 1 has taken its own (here held until rank 0 is gone). Rank 1 finds its sibling gone, but the mark
    rank 0 left says the run is being stopped: it raises Terminated at once with the same note instead of
    waiting REAL_TRAIN_TERM_SECONDS and blaming another process."""
    launcher, tag, log = _sigterm_launch(tmp_path, mode, grace="30")
    started = time.monotonic()
    _wait_then_clean_up(launcher, tag, timeout=60, signal_first=True)
    took = time.monotonic() - started
    text = log.read_text()
    lines = sorted(ln for ln in text.splitlines() if ln.startswith("term-test: terminated"))
    assert lines == ["term-test: terminated; kept checkpoint out/checkpoint-4 (step 4); resume with: the same "
                     "command"] * 2, text[-3000:]
    assert "another process" not in text, text[-3000:]
    assert took < 20, f"the launch took {took:.0f} s to stop"
    assert _none_left(tag) == []


def test_a_two_process_training_stopped_with_sigterm_says_on_every_rank_what_was_kept(tiny_llama, tmp_path):
    """A scheduler stops a real two-process training (SIGTERM to `accelerate launch`) after its first
    checkpoint: every rank ends with the Ctrl-C-style line naming the checkpoint kept and how to resume, and
    none claims that another process failed."""
    pairs = _tiny_pairs(tmp_path, tiny_llama)
    out, tag = tmp_path / "out", uuid.uuid4().hex
    cmd = [ACCELERATE, "launch", "--config_file", "accelerate_configs/cpu_2proc.yaml", "--main_process_port",
           str(free_port()), "-m", "real.train", "--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"),
           "--model_name_or_path", str(tiny_llama), "--dataset_name", str(pairs), "--variant", "no_enhancement",
           "--output_dir", str(out), "--max_steps", "100000", "--per_device_train_batch_size", "1",
           "--global_batch_size", "2", "--save_strategy", "steps", "--save_steps", "1"]
    log = tmp_path / "launch.log"
    with log.open("w") as fh:
        launcher = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                    env={**ENV, "REAL_TEST_TAG": tag, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.time() + 300
        # any complete checkpoint (save_total_limit rotates them away, at several steps a second on a fast CPU)
        while not any(out.glob("checkpoint-*/trainer_state.json")):
            assert launcher.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        _wait_then_clean_up(launcher, tag, timeout=90, signal_first=True)
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("real-train: terminated")]
    assert len(lines) == 2, text[-4000:]
    for line in lines:
        assert re.fullmatch(r"real-train: terminated; kept checkpoint \S+checkpoint-\d+ \(step \d+\); resume with: "
                            r"the same `accelerate launch \.\.\. -m real\.train .+` command", line), line
    assert "another process" not in text and "internal error" not in text, text[-4000:]
    assert _none_left(tag) == []


def test_stop_marks_name_their_launch_and_marks_of_launches_gone_are_removed(tmp_path, monkeypatch):
    """A mark says "a rank of this launch was stopped" only for the launch that is alive now (pid and start
    time), so a sibling of a later launch that reuses the pid never reads an old stop as its own."""
    from real_fae_core import lifeline

    monkeypatch.setattr(lifeline.tempfile, "tempdir", str(tmp_path))
    me = os.getpid()
    assert not lifeline.stop_marked(me)
    marks = lifeline.stop_marks_dir()
    marks.mkdir()
    (marks / f"{me}-1-0").touch()  # this pid, another start time: a launch long gone
    (marks / "999999999-5-1").touch()  # no such process
    assert not lifeline.stop_marked(me)
    lifeline.mark_stop(me)
    assert lifeline.stop_marked(me)
    assert [m.name for m in marks.iterdir()] == [f"{lifeline.launch_key(me)}-{os.environ.get('LOCAL_RANK', '0')}"]
