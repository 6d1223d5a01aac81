"""Helpers every test module may import (plain ``pytest`` and ``python -m pytest`` alike).

Test modules import helpers from here and from the other non-test modules in tests/, never from
conftest.py or from each other, so each file collects on its own.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Real Check-COVID and SciFact files: the small samples shipped in tests/data/ (tests/data/*/SOURCE.md),
# or full copies in the same layout named by REAL_SHARED_DATA.
SAMPLE_DATA = REPO / "tests" / "data"
FULL_DATA = Path(os.environ["REAL_SHARED_DATA"]) if os.environ.get("REAL_SHARED_DATA") else None
REAL_DATA = FULL_DATA or SAMPLE_DATA


def sample_or_full(sample, full):
    """The value a test expects of the shipped samples, or of the full copies when REAL_SHARED_DATA is set."""
    return full if FULL_DATA else sample


def make_record_dict(**overrides) -> dict:
    """A valid record as a dict; tests override fields to break it."""
    rec = {
        "id": "r1",
        "dataset": "toy",
        "claim": "The sky is blue.",
        "label": "SUPPORT",
        "sentences": [
            {"id": 0, "text": "The sky appears blue by day.", "doc": "Sky"},
            {"id": 1, "text": "Grass is green.", "doc": "Grass"},
            {"id": 3, "text": "Rayleigh scattering colours the sky.", "doc": "Sky"},
        ],
        "evidence": [[0], [3]],
    }
    rec.update(overrides)
    return rec


TOY_POOL = [{"id": 0, "text": "The vaccine reduces the risk of severe disease.", "doc": "V"},
            {"id": 2, "text": "Results were consistent across trials.", "doc": "V"},
            {"id": 5, "text": "Grass is green.", "doc": "G"},
            {"id": 9, "text": "The study found no significant effect.", "doc": "S"}]


def toy_training_records(n: int = 6) -> list[dict]:
    """``n`` records for the training tests: SUPPORT (gold 0) and REFUTE (gold 9) in turn, enhanced evidence
    set, so every pair variant can be built from them."""
    return [make_record_dict(id=f"t{i}", label="SUPPORT" if i % 2 else "REFUTE", sentences=TOY_POOL,
                             evidence=[[0]] if i % 2 else [[9]], enhanced_evidence=[0, 2] if i % 2 else [2, 9])
            for i in range(n)]


def kill_once_saved(cmd: list[str], saved, *, what: str, timeout: float, **popen) -> int:
    """Start ``cmd`` in its own process group and SIGKILL the whole group as soon as ``saved()`` is true
    (a checkpoint on disk): a training killed midway, for the resume tests. Returns its exit status."""
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            **popen)
    try:
        deadline = time.time() + timeout
        while not saved():
            assert proc.poll() is None, f"training ended before {what}"
            assert time.time() < deadline, f"no {what} within the time limit"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode


def free_port() -> int:
    """A free TCP port on 127.0.0.1, so parallel `accelerate launch` runs never collide on 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged_processes(tag: str, variable: str = "REAL_TEST_TAG") -> list[int]:
    """Live processes (Linux /proc) whose environment holds ``<variable>=<tag>``: every process a test (or
    the whole run) started with that tag, launchers and ranks alike, wherever they were re-parented."""
    needle = f"{variable}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in env and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """The process exists and has not finished exiting (a zombie has closed its files, so released its locks)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class CpuBurner:
    """Keeps every core busy for at most ``seconds`` (one spinning subprocess per core), so a test sees the
    machine loaded; stopped on exit from the ``with`` block."""

    def __init__(self, seconds: float, workers: int | None = None):
        self.seconds, self.workers, self.procs = seconds, workers or os.cpu_count() or 2, []

    def __enter__(self) -> "CpuBurner":
        import subprocess
        import sys

        spin = f"import time\nend = time.time() + {self.seconds}\nwhile time.time() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(self.workers)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def interruptible() -> None:
    """``preexec_fn`` for a child a test will interrupt with SIGINT: Ctrl-C's default action restored in it.

    A shell starts a background job (``cmd &``, also ``nohup``) with SIGINT ignored, and an ignored signal
    stays ignored through fork and exec, so a child started from such a suite never sees a SIGINT (Python
    installs its KeyboardInterrupt handler only where SIGINT is not ignored). Restoring it in the child makes
    the test check the command, not how the suite was started.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)



def parse_run_args(argv: list[str]):
    """(the options, the --config file) of `fae run`'s own words as the dispatcher parses them (defaults < the
    YAML < the command line; the required options given), without the check that refuses another backend's
    option (:meth:`FaeRunConfig.check_command_line`, tested on its own)."""
    from real_fae_core.cli import command_parser
    from real_fae_core.command import parse_with_config_file
    from fae.ablation.options import require
    from fae.ablation.runner import FaeRunConfig

    parser = command_parser("fae run", FaeRunConfig)
    values, config_file, from_file = parse_with_config_file(parser, argv, FaeRunConfig.config_file_types())
    options = FaeRunConfig.from_parsed(values, parser, from_file)
    require(options)
    return options, config_file
