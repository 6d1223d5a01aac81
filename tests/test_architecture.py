"""The import rule of docs/architecture.md, checked over the source, the tests and the benchmarks.

Every rule is a walk over the AST of each file; a violation names the file,
the line and the import, so a failure says exactly what to change.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("real_fae_core", "data_prep", "fae", "real", "real_fae")
# Tests of training and of the demo may import the trainer; every other test and benchmark may
# use only the demo's data and shipped model (real.demo), never the trainer.
# test_checkpoint_fae.py trains (the FAE-at-each-save callback); test_cpu_loss.py tests the trainer's CPU loss switch; command_walk.py (and test_cli_dialect.py) read the parsers of every console script, real-merge's and real-import-gguf's too; test_list_flags.py real-train's too; test_onpolicy.py tests the on-policy trainer's control draws
TRAINING_TESTS = {"command_walk.py", "test_train.py", "test_train_guards.py", "test_resume_advice.py", "test_demo.py",
                  "test_workflow.py", "test_real_model.py", "test_distributed.py", "cpu_train_step.py",
                  "test_cli_dialect.py", "test_checkpoint_fae.py", "test_cpu_loss.py", "test_gguf_selfcheck.py",
                  "gguf_selfcheck_load.py", "test_list_flags.py", "test_onpolicy.py"}


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> set[str]:
    return {module_name(p) for p in python_files(*PACKAGES)}


def imports(path: Path, package: list[str] | None = None,
            only: str = "all") -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every import in the file; relative imports resolved; name None for ``import x``.

    ``only="top"``: the imports that run when the module is imported (none inside a function);
    ``only="function"``: the imports inside a function body (they run when it is called).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if package is None:
        package = module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
    in_function = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if only != "all" and (id(node) in in_function) != (only == "function"):
            continue
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


def imported_module(mod: str, name: str | None, modules: set[str]) -> str | None:
    """The project module an import loads: ``from pkg import mod`` is ``pkg.mod``, ``from mod import f`` is ``mod``."""
    if name and f"{mod}.{name}" in modules:
        return f"{mod}.{name}"
    while mod and mod not in modules:
        mod = mod.rpartition(".")[0]
    return mod or None


def import_graph(only: str = "all") -> dict[str, dict[str, str]]:
    """``{module: {imported project module: "file:line"}}`` over the packages."""
    modules = project_modules()
    graph: dict[str, dict[str, str]] = {}
    for p in python_files(*PACKAGES):
        source = module_name(p)
        edges = graph.setdefault(source, {})
        for line, mod, name in imports(p, only=only):
            target = imported_module(mod, name, modules) if top(mod) in PACKAGES else None
            if target and target != source:
                edges.setdefault(target, where(p, line))
    return graph


def import_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


# Third-party packages that take seconds to import (or are optional): a command's --help must not wait for them.
HEAVY = frozenset({"torch", "transformers", "vllm", "trl", "peft", "accelerate", "datasets", "deepspeed",
                   "matplotlib", "scipy", "openai", "safetensors", "huggingface_hub", "tokenizers", "pandas",
                   "inspect_ai", "ray"})
OPTIONAL = frozenset({"vllm", "inspect_ai", "ray"})  # extras: a module importing one at top level must be imported only when used


def heavy_at_import() -> dict[str, set[str]]:
    """For each project module, the HEAVY packages importing it loads.

    Followed: its top-level imports and its parent packages' ``__init__`` (importing ``a.b.c`` runs ``a/b``).
    """
    modules = project_modules()
    direct: dict[str, set[str]] = {}
    graph = import_graph("top")
    for p in python_files(*PACKAGES):
        direct[module_name(p)] = {top(mod) for _, mod, _ in imports(p, only="top") if top(mod) in HEAVY}
    loaded: dict[str, set[str]] = {}
    for m in modules:
        seen, todo, found = {m}, [m], set()
        while todo:
            v = todo.pop()
            found |= direct.get(v, set())
            parents = {v.rsplit(".", k)[0] for k in range(1, v.count(".") + 1)}
            for w in [*graph.get(v, {}), *parents]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        loaded[m] = found
    return loaded


def command_modules() -> set[str]:
    """The modules a console command starts in: the subcommand tables and the console scripts of pyproject.toml."""
    import tomllib

    from data_prep.cli import SUBCOMMANDS as DATA_COMMANDS
    from fae.cli import SUBCOMMANDS as FAE_COMMANDS

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"].values()
    return ({entry.split(":")[0] for entry, _ in [*DATA_COMMANDS.values(), *FAE_COMMANDS.values()]}
            | {entry.split(":")[0] for entry in scripts})


def test_core_imports_nothing_else_of_the_project():
    bad = [f"{where(p, line)}: {mod}" for p in python_files("real_fae_core")
           for line, mod, name in imports(p)
           if top(mod) in PACKAGES and top(mod) != "real_fae_core"]
    assert not bad, "real_fae_core must not import the rest of the project:\n" + "\n".join(bad)


@pytest.mark.parametrize("package, forbidden", [("real_fae_core", {"data_prep", "fae", "real", "real_fae"}),
                                                ("data_prep", {"fae", "real", "real_fae"}),
                                                ("fae", {"real", "real_fae"}), ("real_fae", {"real"})])
def test_layering(package, forbidden):
    bad = [f"{where(p, line)}: {mod}" for p in python_files(package)
           for line, mod, _ in imports(p) if top(mod) in forbidden]
    assert not bad, f"{package} must not import {sorted(forbidden)}:\n" + "\n".join(bad)


# A layer shared by several subpackages, and those users: the layer never imports them (docs/architecture.md).
SHARED_LAYERS = {"data_prep.llm": ("data_prep.enhance", "data_prep.counterfactual")}


@pytest.mark.parametrize("layer, users", sorted(SHARED_LAYERS.items()))
def test_a_shared_layer_imports_none_of_its_users(layer, users):
    modules = project_modules()
    assert layer in modules and all(u in modules for u in users), "a SHARED_LAYERS entry names no package"
    bad = [f"{where(p, line)}: {target}" for p in python_files(layer.replace(".", "/"))
           for line, mod, name in imports(p) if top(mod) in PACKAGES
           for target in [imported_module(mod, name, modules)]
           if target and any(target == u or target.startswith(u + ".") for u in users)]
    assert not bad, f"{layer} must not import {list(users)}:\n" + "\n".join(bad)


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


# Other packages' names that are not their public API: (file, module) -> why; docs/architecture.md lists them.
OTHER_PACKAGES_PRIVATE_IMPORTS = {
    ("fae/harness/inspect_internals.py", "inspect_ai._util.error"): "PrerequisiteError: Inspect exports no public home",
    ("fae/harness/inspect_internals.py", "inspect_ai.model._model"): "active_model: get_model() falls back or raises",
    ("real_fae_core/openai_client.py", "openai"): "_base_client: the httpx (httpx2) module the installed openai uses",
    ("real_fae_core/openai_client.py", "openai._vendor.httpx_aiohttp"): "whether this openai vendors its aiohttp transport",
    ("tests/test_pairs.py", "trl.data_utils"): "_tokenize: the tokenization TRL trains on, which token_lengths must match",
    ("tests/test_structured.py", "xgrammar.testing"): "_is_grammar_accept_string: xgrammar's own acceptance check",
}


def test_no_private_names_of_other_packages_outside_the_listed_places():
    """A private name of another package may move in any release; each use is listed above with why, in one module."""
    bad, seen = [], set()
    for p in python_files(*PACKAGES, "tests", "benchmarks"):
        for line, mod, name in imports(p):
            if not mod or top(mod) in PACKAGES:
                continue
            if any(is_private(part) for part in mod.split(".")) or (name and is_private(name)):
                key = (str(p.relative_to(REPO)), mod)
                seen.add(key)
                if key not in OTHER_PACKAGES_PRIVATE_IMPORTS:
                    bad.append(f"{where(p, line)}: {mod}{'.' + name if name else ''}")
    assert not bad, "private names of other packages imported outside the listed places:\n" + "\n".join(bad)
    assert seen == set(OTHER_PACKAGES_PRIVATE_IMPORTS), "a listed private import is gone: drop it from the list"


def is_command_module(module: str) -> bool:
    """A subcommand's argparse shell: ``*.cli`` / ``*_cli`` (none is left: a command in the one layout is its library
    module, which callers import; docs/architecture.md). Not the console commands ``fae.cli`` and
    ``data_prep.cli`` (calling their ``main`` runs a command line) nor the dispatcher ``real_fae_core.cli``."""
    last = module.rsplit(".", 1)[-1]
    return (last == "cli" or last.endswith("_cli")) and module not in ("real_fae_core.cli", "fae.cli", "data_prep.cli")


def test_no_module_imports_a_command_module():
    """A command shell module would be a thin shell (its parser, its CONFIG, its run); what others need is in the
    library module it imports. Tests drive the commands and may import them."""
    modules = project_modules()
    bad = []
    for p in python_files(*PACKAGES, "benchmarks"):
        source = module_name(p)
        for line, mod, name in imports(p):
            target = imported_module(mod, name, modules) if top(mod) in PACKAGES else None
            if target and target != source and is_command_module(target):
                bad.append(f"{where(p, line)}: {source} imports the command module {target}")
            if target == "real_fae_core.cli" and source not in ("fae.cli", "data_prep.cli"):
                bad.append(f"{where(p, line)}: {source} imports the dispatcher (real_fae_core.entry has run_guarded)")
    assert not bad, "command modules imported as libraries:\n" + "\n".join(bad)


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


def test_no_import_cycles_function_level_imports_included():
    """A circle hidden behind an import inside a function is still a circle: neither module stands alone."""
    graph = import_graph()
    cycles = import_cycles(graph)
    report = []
    for cycle in cycles:
        report.append(" <-> ".join(cycle))
        report += [f"    {a} -> {b}  ({graph[a][b]})" for a in cycle for b in graph.get(a, {}) if b in cycle]
    print("\n".join(report))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(report)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:1"}, "c": {"a": "c.py:3"}, "d": {"a": "d.py:1"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b": "a.py:1"}, "b": {}}) == []


def test_function_level_project_imports_only_where_a_heavy_or_optional_dependency_demands_it():
    """An import inside a function hides what a module needs; allowed only in two cases:

    - the imported module loads an optional dependency (vllm) when imported, from any module;
    - a command's entry module (a subcommand of ``fae`` / ``real-data``, a console script) delays a
      module that loads a HEAVY package (torch, transformers, openai, matplotlib, ...) when
      imported, so that ``fae --help`` and the other commands' help stay fast.
    """
    modules, commands, heavy = project_modules(), command_modules(), heavy_at_import()
    bad: list[str] = []
    for p in python_files(*PACKAGES):
        source = module_name(p)
        for line, mod, name in imports(p, only="function"):
            target = imported_module(mod, name, modules) if top(mod) in PACKAGES else None
            if target is None or heavy[target] & OPTIONAL or (source in commands and heavy[target]):
                continue
            if any(b.startswith(f"{where(p, line)}: {source} imports {target} ") for b in bad):
                continue  # one line per imported module: ``from m import a, b`` is one import
            bad.append(f"{where(p, line)}: {source} imports {target} inside a function"
                       + (f" (it loads {sorted(heavy[target])}, but {source} is no command entry)"
                          if heavy[target] else " (it loads nothing heavy: import it at the top)"))
    print("\n".join(bad))
    assert not bad, f"{len(bad)} function-level project import(s):\n" + "\n".join(bad)


def test_no_function_is_longer_than_80_lines():
    """A function longer than a screen does several jobs; split it where its stages are, each named for what
    it does (docstring and signature count)."""
    import ast

    long = []
    for p in python_files(*PACKAGES):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long.append(f"{p.relative_to(REPO)}:{node.lineno}: {node.name} ({n} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
