"""Fixtures: tiny models with real chat templates, the real Check-COVID / SciFact files; the gpu lane;
a suite that leaves no process behind; its share of the cores for each pytest-xdist worker."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REAL_DATA, tagged_processes

SUITE_TAG = "REAL_TEST_SUITE"  # every process this run starts inherits REAL_TEST_SUITE=<this run's id>
LEFT_GRACE_SECONDS = 15


def pytest_configure(config):
    """Tag this run (each pytest-xdist worker tags its own): each child (launcher, rank, server, browser)
    inherits the tag through its environment. A worker takes its share of the cores: the workers run
    side by side, so torch in the worker and in every child it starts (OMP_NUM_THREADS) uses
    cores // workers threads instead of every core each."""
    config.suite_tag = uuid.uuid4().hex
    os.environ[SUITE_TAG] = config.suite_tag
    config.left_reports = []  # the controller's: the processes each worker found left behind
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        share = max(1, cores // int(workerinput.get("workercount", 1)))
        config.threads_given = "OMP_NUM_THREADS" in os.environ  # the run's own setting is kept
        os.environ.setdefault("OMP_NUM_THREADS", str(share))  # read when torch loads: before collection does
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _distributed(config) -> bool:
    """This process is pytest-xdist's controller: the tests (and what they start) run in its workers."""
    return config.pluginmanager.has_plugin("dsession")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller collects what a finished worker found left behind (pytest-xdist hook)."""
    node.config.left_reports.extend(getattr(node, "workeroutput", {}).get("left_processes", []))


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a process it started is still alive once every test is done (after a short grace);
    name each one, and end it. Under pytest-xdist each worker checks its own children after its last test
    and hands the list to the controller, which reports it and fails the run."""
    config = session.config
    if _distributed(config):
        _report_left(session, config.left_reports)
        return
    tag = getattr(config, "suite_tag", None)
    if tag is None:
        return
    deadline = time.monotonic() + LEFT_GRACE_SECONDS
    while (left := [pid for pid in tagged_processes(tag, SUITE_TAG) if pid != os.getpid()]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    report = []
    worker = f" (worker {config.workerinput['workerid']})" if hasattr(config, "workerinput") else ""
    for pid in left:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        report.append(f"  pid {pid}{worker}: {cmd[:200]}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if hasattr(config, "workerinput"):  # a worker: the controller reports it (a worker's output is not shown)
        config.workeroutput["left_processes"] = report
        return
    _report_left(session, report)


def _report_left(session, report: list[str]) -> None:
    if not report:
        return
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (f"{len(report)} process(es) started by this test run were still alive {LEFT_GRACE_SECONDS} s after "
            "the last test (now killed):\n" + "\n".join(report))
    if terminal is not None:
        terminal.write_line(text, red=True)
    else:
        print(text)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _cuda_missing() -> str | None:
    """Why `gpu` tests cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA"
    return None if torch.cuda.is_available() else "needs a CUDA device (none found)"


def pytest_collection_modifyitems(config, items):
    """Skip every `gpu`-marked test, with the reason, where no CUDA device is usable."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    reason = _cuda_missing() if gpu_tests else None
    for item in gpu_tests if reason else ():
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding check-covid/ and scifact/: tests/data (small samples) or REAL_SHARED_DATA."""
    if not REAL_DATA.is_dir():
        pytest.fail(f"real data not found at {REAL_DATA} (REAL_SHARED_DATA names a folder with "
                    "check-covid/ and scifact/)")
    return REAL_DATA


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama with the real Llama-3.1-Instruct chat template."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2 with the real Qwen2.5-Instruct chat template."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), "qwen2")


@pytest.fixture(scope="session")
def noisy_llama(tiny_llama, tmp_path_factory) -> Path:
    """The tiny random Llama with weights x5: greedy answers then take a few tokens and depend on
    the prompt (the unscaled one answers blank lines to everything), so comparing runs means
    something and a run is slow enough to interrupt."""
    from tiny_models import noisy_copy

    return noisy_copy(tiny_llama, tmp_path_factory.mktemp("noisy-llama"))


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request, tiny_llama, tiny_qwen) -> Path:
    return tiny_llama if request.param == "llama" else tiny_qwen
