"""recipes/smollm2-135m-instruct/reproduce.sh refuses, before its first step, a Python that lacks an extra a step
needs: one line naming the missing package and the one install line that installs everything the script runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SCRIPT = REPO / "recipes/smollm2-135m-instruct/reproduce.sh"
INSTALL = f'pip install torch==2.13.0 -e "{REPO}[gguf,structured]"'
# the official files the script converts (only their presence is checked before the first step)
RAW_FILES = ("check-covid/covidCheck_train_composed+extracted.json", "check-covid/covidCheck_test_composed.json",
             "check-covid/covidCheck_test_extracted.json", "check-covid/corpus.json", "scifact/claims_dev.jsonl",
             "scifact/corpus.jsonl")


def _env(tmp_path: Path, blocked: str | None) -> dict:
    """The script's environment: this Python first on PATH, the raw files present, and ``blocked`` unimportable
    (a module of that name that raises ImportError shadows the installed one)."""
    raw = tmp_path / "raw"
    for name in RAW_FILES:
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / name).write_text("{}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in {"MODEL", "VARIANTS", "TEST_SETS", "DATA_DIR", "OUTPUTS_DIR", "RUNS_DIR", "ENHANCE", "RAW",
                        "PYTHON", "MODEL_NEEDS", "MIN_FREE_GB", "BASE_FAE_ARGS", "FAE_ARGS", "PAVE_ARGS"}}
    env.update(RAW=str(raw), MIN_FREE_GB="0", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    if blocked:
        shadow = tmp_path / "shadow"
        shadow.mkdir()
        (shadow / f"{blocked}.py").write_text(f"raise ImportError('{blocked} is not installed here')\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow), env.get("PYTHONPATH")]))
    return env


def _run(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_missing_extra_stops_the_script_with_one_line_before_any_step(tmp_path):
    env = _env(tmp_path, blocked="xgrammar")  # the base model's FAE runs with --constrained-decoding (hf)
    p = _run(tmp_path, env)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stderr.splitlines() == [
        "reproduce: the Python package 'xgrammar' (extra [structured], needed by --constrained-decoding with the "
        f"hf backend) is missing from python3; {INSTALL} installs everything this script runs; nothing was run"]
    assert "+ " not in p.stdout and not list((tmp_path / "work").iterdir())  # no step ran, nothing written
    # the GGUF import's extra, the same way
    p = _run(tmp_path, _env(tmp_path / "g", blocked="gguf"))
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "'gguf' (extra [gguf], needed by the base model's set-up (prepare_model)) is missing" in p.stderr
    assert INSTALL in p.stderr


def test_the_dry_run_shows_the_check_and_goes_on(tmp_path):
    p = _run(tmp_path, _env(tmp_path, blocked="xgrammar"), "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "'xgrammar' (extra [structured]" in p.stderr and INSTALL in p.stderr
    assert "# prerequisites: 1 missing (listed on stderr); a real run would stop here" in p.stdout
    assert "+ import_packaged_gguf" in p.stdout and "# dry run: nothing was executed" in p.stdout
    p = _run(tmp_path / "ok", _env(tmp_path / "ok", blocked=None), "--dry-run")
    assert p.returncode == 0 and "# prerequisites: all present" in p.stdout, p.stdout[-2000:] + p.stderr
