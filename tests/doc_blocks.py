"""The code blocks of the docs, run as written: the one reader of a page's ```bash blocks and the one way a test
runs a shell script (a block, a recipe) with bash, failing on the first error.

A block names what its user chooses as settings at its top, ``X=${X:-default}  # what it is``: a test binds those
through the environment (:func:`settings` lists them) and nothing else, so what runs is what the page shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
_SETTING = re.compile(r"^([A-Z][A-Z0-9_]*)=\$\{\1:-", re.M)


def bash_blocks(page: Path) -> list[str]:
    """The ```bash blocks of a Markdown page, in page order, as written."""
    return _BASH_BLOCK.findall(page.read_text(encoding="utf-8"))


def bash_block_under(page: Path, heading: str) -> str:
    """The first ```bash block after the line ``heading`` (e.g. ``## Workflow for a real model``)."""
    text = page.read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"{page.name}: no heading {heading!r}"
    m = _BASH_BLOCK.search(text.split(f"\n{heading}\n", 1)[1])
    assert m, f"{page.name}: no bash block under {heading!r}"
    return m.group(1)


def settings(block: str) -> set[str]:
    """The settings a block leaves to its user: the variables it sets as ``X=${X:-default}``."""
    return set(_SETTING.findall(block))


def run_bash(args: list[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """``bash -eo pipefail ARGS`` in ``cwd``, in a process group of its own; a failure shows the ends of its
    output, and past ``timeout`` seconds the whole group is killed (no command of the script left running)."""
    proc = subprocess.Popen(["bash", "-eo", "pipefail", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"bash {args} ran past {timeout} s:\n{out[-4000:]}\n{err[-6000:]}") from None
    assert proc.returncode == 0, f"bash {args} failed ({proc.returncode}):\n{out[-4000:]}\n{err[-6000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
