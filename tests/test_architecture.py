"""The import rule of docs/architecture.md, checked over the source, the tests and the benchmarks.

Every rule is a walk over the AST of each file; a violation names the file,
the line and the import, so a failure says exactly what to change.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("real_fae_core", "data_prep", "fae", "real")
# Tests of training and of the demo may import the trainer; every other test and benchmark may
# use only the demo's data and shipped model (real.demo), never the trainer.
TRAINING_TESTS = {"test_train.py", "test_train_guards.py", "test_resume_advice.py", "test_demo.py",
                  "test_workflow.py", "test_real_model.py", "cpu_train_step.py"}


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> set[str]:
    return {module_name(p) for p in python_files(*PACKAGES)}


def imports(path: Path, package: list[str] | None = None) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every import in the file; relative imports resolved; name None for ``import x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if package is None:
        package = module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out += [(node.lineno, module, a.name) for a in node.names]
    return out


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def top(module: str) -> str:
    return module.split(".")[0]


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_core_imports_nothing_else_of_the_project():
    bad = [f"{where(p, line)}: {mod}" for p in python_files("real_fae_core")
           for line, mod, name in imports(p)
           if top(mod) in PACKAGES and top(mod) != "real_fae_core"]
    assert not bad, "real_fae_core must not import the rest of the project:\n" + "\n".join(bad)


@pytest.mark.parametrize("package, forbidden", [("real_fae_core", {"data_prep", "fae", "real"}),
                                                ("data_prep", {"fae", "real"}), ("fae", {"real"})])
def test_layering(package, forbidden):
    bad = [f"{where(p, line)}: {mod}" for p in python_files(package)
           for line, mod, _ in imports(p) if top(mod) in forbidden]
    assert not bad, f"{package} must not import {sorted(forbidden)}:\n" + "\n".join(bad)


def test_no_private_names_across_modules():
    bad = []
    for p in python_files(*PACKAGES, "tests", "benchmarks"):
        for line, mod, name in imports(p):
            if top(mod) not in PACKAGES:
                continue
            if any(is_private(part) for part in mod.split(".")):
                bad.append(f"{where(p, line)}: private module {mod}")
            elif name and is_private(name):
                bad.append(f"{where(p, line)}: private name {mod}.{name}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_no_private_attribute_of_an_imported_project_module():
    """``import fae.ablation.runio as runio; runio._x`` is the same violation as importing ``_x``."""
    modules = project_modules()
    bad = []
    for p in python_files(*PACKAGES, "tests", "benchmarks"):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module and top(node.module) in PACKAGES:
                for a in node.names:
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and is_private(node.attr)):
                bad.append(f"{where(p, node.lineno)}: {aliases[node.value.id]}.{node.attr}")
    assert not bad, "private attributes of other modules used:\n" + "\n".join(bad)


def test_evaluation_tests_and_benchmarks_do_not_need_the_trainer():
    bad = []
    for p in python_files("tests", "benchmarks"):
        if p.name in TRAINING_TESTS:
            continue
        for line, mod, name in imports(p):
            full = f"{mod}.{name}" if name and mod == "real" else mod
            if top(full) == "real" and not (full == "real.demo" or full.startswith("real.demo.")):
                bad.append(f"{where(p, line)}: {full}")
    assert not bad, ("only training and demo tests may import the trainer (real); others use "
                     "tests/tiny_models.py or real.demo's data:\n" + "\n".join(bad))


def test_the_rule_sees_a_violation(tmp_path):
    """The walker itself works: a planted private import and an upward import are found."""
    planted = tmp_path / "probe.py"
    planted.write_text("from data_prep.records import _x\nimport real.train\nfrom ..ablation import runio\n")
    found = imports(planted, package=["fae", "probes"])
    assert (1, "data_prep.records", "_x") in found and (2, "real.train", None) in found
    assert (3, "fae.ablation", "runio") in found


def test_architecture_doc_names_every_package_and_subpackage():
    doc = (REPO / "docs" / "architecture.md").read_text()
    packages = {module_name(p.parent) for p in python_files(*PACKAGES) if p.name == "__init__.py"}
    missing = [pkg for pkg in packages if pkg.split(".")[-1] + "/" not in doc]
    assert not missing, f"docs/architecture.md does not mention {missing}"
