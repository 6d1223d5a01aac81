"""Test hygiene: every file collects under plain `pytest` and `python -m pytest`; `gpu` tests skip with a reason."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

TESTS = REPO / "tests"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_test_modules_import_neither_conftest_nor_each_other():
    """`from tests.x` needs the repository root on sys.path (plain `pytest` lacks it), importing conftest
    makes a second copy of it, and a test module imported by another runs its module-level code twice."""
    own = {p.stem for p in TESTS.glob("*.py")}
    bad = []
    for path in sorted(TESTS.glob("*.py")):
        for name in _imported_modules(path):
            top = name.split(".")[0]
            if top == "tests" or name == "conftest" or (top in own and top.startswith("test_")):
                bad.append(f"{path.name}: imports {name}")
    assert not bad, "shared test code belongs in tests/helpers.py (or another non-test module):\n" + "\n".join(bad)


@pytest.mark.slow
def test_gpu_tests_are_skipped_with_a_reason_without_cuda(tmp_path):
    """The conftest hook, run by a real pytest on a gpu-marked test beside a copy of this suite's conftest."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the hook leaves gpu tests to run")
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_needs_cuda():\n    assert False, 'ran without CUDA'\n\n\n"
        "def test_cpu():\n    assert True\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q",
                        "-o", "markers=gpu: needs CUDA", str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 passed, 1 skipped" in p.stdout
    assert "needs a CUDA device (none found)" in p.stdout


def test_interruptible_gives_ctrl_c_back_to_a_child_of_a_background_suite():
    """A suite started as a background job (`pytest &`, nohup) has SIGINT ignored, and so would every child;
    helpers.interruptible restores Ctrl-C in the child a test will interrupt."""
    from helpers import interruptible

    probe = [sys.executable, "-c", "import signal; h = signal.getsignal(signal.SIGINT); "
             "print('ignored' if h == signal.SIG_IGN else 'python' if h is signal.default_int_handler else h)"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the shell starts a background job
    try:
        plain = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout.strip()
        restored = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                                  preexec_fn=interruptible).stdout.strip()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert plain == "ignored"  # what the signal tests would meet without the lane's reset
    assert restored == "python"  # Ctrl-C raises KeyboardInterrupt in the child


def test_a_worker_takes_its_share_of_the_cores(request):
    """Under pytest-xdist the workers run side by side: torch in each, and the processes a test starts
    (OMP_NUM_THREADS), use the worker's share of the cores, not every core each (tests/conftest.py)."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        pytest.skip("one process (-n 0): torch keeps its own default")
    import torch

    share = int(os.environ["OMP_NUM_THREADS"])
    assert torch.get_num_threads() == share
    if not request.config.threads_given:  # OMP_NUM_THREADS set for the run is kept
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        assert share == max(1, cores // int(workerinput["workercount"]))


def test_every_test_has_a_time_ceiling(request):
    """pytest-timeout is configured: a hang fails its test with every thread's stack instead of stalling CI."""
    assert 0 < float(request.config.getini("timeout")) <= 1800
    assert request.config.getini("timeout_method") == "signal"  # the run goes on after a timed-out test


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds left-over processes through /proc")
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_run_that_leaves_a_process_behind_fails_and_names_it(tmp_path, workers):
    """The conftest's end-of-run check, on a real pytest run whose one test starts a detached process: in one
    process, and under pytest-xdist (the worker that ran the test finds it, the controller fails the run)."""
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    marker = f"{time.time_ns()}"
    (tmp_path / "test_leak.py").write_text(
        "import subprocess, sys\n\n\ndef test_leaks():\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'],\n"
        "                     start_new_session=True)\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *workers, str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 passed" in p.stdout
    assert "1 process(es) started by this test run were still alive" in p.stdout
    assert marker in p.stdout  # named by its command line
    leftover = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""  # and ended
