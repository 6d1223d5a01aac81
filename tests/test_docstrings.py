"""Every public function and method of the library packages has a docstring.

A walk over the AST of each file (nothing is imported, so the test takes well under a second).
Counted: module-level functions (those under a module-level ``if``/``try`` too) and the methods of
public classes, nested public classes included, whose name does not start with ``_``. Not counted:
dunders and private names, property setters and deleters, ``@overload`` stubs, and functions
defined inside functions (closures, local classes).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("real_fae_core", "fae", "data_prep", "real", "real_fae")

# Functions still without a docstring, as (path relative to the repository, function or Class.method): none. An
# entry added here that is documented (or gone) fails the test, so the set cannot go stale.
PENDING: set[tuple[str, str]] = set()

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SKIPPED_DECORATORS = {"setter", "deleter", "overload"}


def decorator_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The last name of each decorator: ``x.setter`` is ``setter``, ``typing.overload`` ``overload``."""
    names = set()
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute):
            names.add(d.attr)
        elif isinstance(d, ast.Name):
            names.add(d.id)
    return names


def public_functions(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of each counted function in ``body``; never enters a function body."""
    for node in body:
        if isinstance(node, FUNCTIONS):
            if not node.name.startswith("_") and not decorator_names(node) & SKIPPED_DECORATORS:
                yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            if not node.name.startswith("_"):
                yield from public_functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            for block in blocks:
                yield from public_functions(block, prefix)


def undocumented() -> list[tuple[str, int, str]]:
    """``(relative path, line, name)`` of every counted function without a docstring, in file order."""
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            rel = path.relative_to(REPO).as_posix()
            out += [(rel, node.lineno, name) for name, node in public_functions(tree.body)
                    if ast.get_docstring(node) is None]
    return out


def test_every_public_function_has_a_docstring():
    missing = [(rel, line, name) for rel, line, name in undocumented() if (rel, name) not in PENDING]
    listing = "\n".join(f"{rel}:{line} {name}" for rel, line, name in missing)
    if missing:
        print(listing)
    assert not missing, f"{len(missing)} public functions without a docstring:\n{listing}"


def test_pending_names_only_what_is_still_missing():
    still = {(rel, name) for rel, _line, name in undocumented()}
    stale = sorted(PENDING - still)
    assert not stale, f"documented (or gone), to be removed from PENDING: {stale}"


def test_the_walk_counts_what_it_should():
    source = '''
def public(): pass
def _private(): pass
if True:
    def guarded(): pass
class Public:
    def method(self): pass
    def __init__(self): pass
    @property
    def value(self):
        """documented"""
    @value.setter
    def value(self, v): pass
    class Inner:
        def deep(self): pass
class _Hidden:
    def method(self): pass
def outer():
    """documented"""
    def nested(): pass
    class Local:
        def method(self): pass
'''
    names = [name for name, node in public_functions(ast.parse(source).body) if ast.get_docstring(node) is None]
    assert names == ["public", "guarded", "Public.method", "Public.Inner.deep"]
