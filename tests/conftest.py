"""Fixtures: tiny models with real chat templates, the real Check-COVID / SciFact files; the gpu lane;
a suite that leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from helpers import REAL_DATA, tagged_processes

SUITE_TAG = "REAL_TEST_SUITE"  # every process this run starts inherits REAL_TEST_SUITE=<this run's id>
LEFT_GRACE_SECONDS = 15


def pytest_configure(config):
    """Tag this run: each child (launcher, rank, server, browser) inherits the tag through its environment."""
    config.suite_tag = uuid.uuid4().hex
    os.environ[SUITE_TAG] = config.suite_tag


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a process it started is still alive once every test is done (after a short grace);
    name each one, and end it."""
    tag = getattr(session.config, "suite_tag", None)
    if tag is None:
        return
    deadline = time.monotonic() + LEFT_GRACE_SECONDS
    while (left := [pid for pid in tagged_processes(tag, SUITE_TAG) if pid != os.getpid()]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    report = []
    for pid in left:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        report.append(f"  pid {pid}: {cmd[:200]}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (f"{len(left)} process(es) started by this test run were still alive {LEFT_GRACE_SECONDS} s after "
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
