"""Test hygiene: every file collects under plain `pytest` and `python -m pytest`; `gpu` tests skip with a reason."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
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
