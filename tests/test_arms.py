"""FAE's arms are declared once (:class:`fae.ablation.engine.Arms`) and checked once (its ``__post_init__``).

``fae run``'s options inherit Arms' fields, the Inspect AI task takes its defaults from ``Arms()`` and checks by
constructing one, and a run's fingerprint (resume, shards, ``fae merge``) compares every field. These tests
fail where an arm is declared a second time: a field written again in ``RunFields``, an Inspect parameter whose
default is a literal or differs from ``Arms()``'s, a list of the arm names kept by hand.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from real_fae_core.errors import UserError
from real_fae_core.fingerprint import COMPATIBILITY_DEFAULTS
from fae.ablation import runio, shards
from fae.ablation.engine import (ABLATION_ONLY, ARM_FIELDS, ARM_TYPES, DEFAULT_ARMS, ArmError, ArmOptions, Arms)
from fae.ablation.runner import FaeRunConfig, RunFields, arms_of

REPO = Path(__file__).resolve().parents[1]
# The modules that use the arms without declaring them
USERS = ("real_fae/tasks.py", "fae/harness/inspect_task.py", "fae/harness/logrun.py", "fae/ablation/options.py",
         "fae/ablation/runio.py", "fae/ablation/shards.py", "fae/ablation/merge.py", "fae/ablation/runner.py",
         "fae/ablation/ray_executor.py")


def test_the_run_options_inherit_the_arms_fields():
    own = {f.name: f for f in dataclasses.fields(RunFields)}
    hints = typing.get_type_hints(RunFields)
    assert issubclass(RunFields, ArmOptions) and issubclass(FaeRunConfig, ArmOptions)
    assert not set(ARM_FIELDS) & set(RunFields.__dict__.get("__annotations__", {}))  # none written again
    for f in dataclasses.fields(Arms):
        mine = own[f.name]
        assert (mine.default, hints[f.name]) == (f.default, ARM_TYPES[f.name]), f.name
        assert dict(mine.metadata) == dict(f.metadata) and mine.metadata["help"] is f.metadata["help"], f.name


def test_arms_of_builds_the_arms_from_the_run_options():
    assert arms_of(FaeRunConfig()) == DEFAULT_ARMS
    opts = FaeRunConfig(control="random", control_seed=3, gold_only=False, cited_only=False, size_sweep=False,
                           sweep_seed=5, line_ids="renumbered")
    assert arms_of(opts) == Arms(**{name: getattr(opts, name) for name in ARM_FIELDS})
    with pytest.raises(UserError, match=r"^--control 'gap': choose matched, random, none$"):
        arms_of(FaeRunConfig(control="gap"))


@pytest.mark.parametrize("kwargs,message,choice", [
    ({"control": "gap"}, "--control 'gap': choose matched, random, none", True),
    ({"line_ids": "x"}, "--line-ids 'x': choose original or renumbered", True),
    ({"control_seed": 1.5}, "--control-seed 1.5: expected an integer", False),
    ({"sweep_seed": True}, "--sweep-seed True: expected an integer", False),
    ({"gold_only": "yes"}, "--gold-only 'yes': expected true or false", False),
    ({"size_sweep": 1}, "--size-sweep 1: expected true or false", False),
])
def test_one_check_of_the_arms(kwargs, message, choice):
    with pytest.raises(ArmError) as err:
        Arms(**kwargs)
    assert str(err.value) == message and isinstance(err.value, ValueError)
    (name, value), = kwargs.items()
    assert (err.value.name, err.value.value, err.value.choice) == (name, value, choice)


def test_the_inspect_task_says_the_same_check_as_task_options():
    pytest.importorskip("inspect_ai")
    from fae.harness.inspect_task import ARM_OPTIONS, check_arms

    assert ARM_OPTIONS == dataclasses.asdict(DEFAULT_ARMS) and tuple(ARM_OPTIONS) == ARM_FIELDS
    assert check_arms() == DEFAULT_ARMS and check_arms(control="none", gold_only=False) == Arms(control="none",
                                                                                                  gold_only=False)
    for kwargs, message in (({"control": "x"}, "task option control: 'x'; choose matched, random, none"),
                            ({"line_ids": "x"}, "task option line_ids: 'x'; choose original or renumbered"),
                            ({"gold_only": "yes"}, "task option gold_only: expected true or false (got 'yes')"),
                            ({"control_seed": 1.5}, "task option control_seed: expected an integer (got 1.5)")):
        with pytest.raises(UserError) as err:
            check_arms(**kwargs)
        assert str(err.value) == message


def test_the_inspect_parameters_are_the_arms_with_their_defaults():
    pytest.importorskip("inspect_ai")
    from fae.harness.inspect_task import fae_ablation, fae_scorer
    from real_fae.tasks import fae, fae_options

    for fn in (fae_options, fae, fae_ablation, fae_scorer):
        params = inspect.signature(fn).parameters
        arms = [name for name in params if name in ARM_FIELDS]
        assert tuple(arms) == ARM_FIELDS, fn
        for name in arms:
            assert params[name].default == getattr(DEFAULT_ARMS, name), (fn, name)
            assert params[name].annotation in (ARM_TYPES[name], ARM_TYPES[name].__name__), (fn, name)


def arm_name_constants(node: ast.AST) -> list[str]:
    return [e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant) and e.value in ARM_FIELDS]


def second_declarations(path: Path) -> list[str]:
    """Where ``path`` declares an arm again: a parameter or field named for an arm whose default is not read
    from an ``Arms`` (``DEFAULT_ARMS.control``), or a tuple, list or set that spells out arm names (a second
    list to keep in step with Arms)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            named = [*node.posonlyargs, *node.args]
            pairs = list(zip(named[len(named) - len(node.defaults):], node.defaults))
            pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
            found += [f"{path.name}:{d.lineno}: parameter {a.arg} = {ast.unparse(d)}" for a, d in pairs
                      if a.arg in ARM_FIELDS and not (isinstance(d, ast.Attribute) and d.attr == a.arg)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in ARM_FIELDS:
            found.append(f"{path.name}:{node.lineno}: field {node.target.id}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(arm_name_constants(node)) >= 2:
            found.append(f"{path.name}:{node.lineno}: the arm names {arm_name_constants(node)} listed by hand")
    return found


@pytest.mark.parametrize("path", USERS)
def test_no_arm_is_declared_again(path):
    assert not second_declarations(REPO / path)


def test_the_rule_sees_a_second_declaration(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def task(control: str = 'matched', gold_only: bool = DEFAULT_ARMS.gold_only):\n"
                       "    pass\n\n\n@dataclass\nclass Options:\n    line_ids: str = 'original'\n\n\n"
                       "KEYS = ('rounds', 'control', 'control_seed')\n")
    assert second_declarations(planted) == [
        "planted.py:1: parameter control = 'matched'", "planted.py:7: field line_ids",
        "planted.py:10: the arm names ['control', 'control_seed'] listed by hand"]


def test_every_arm_is_in_the_fingerprint_a_resume_and_a_merge_compare():
    for keys in (runio.RESUME_KEYS, runio.RUN_FINGERPRINT.keys, shards.SHARD_FINGERPRINT.keys):
        assert set(ARM_FIELDS) <= set(keys)
    # a run made before an arm existed did not ask it: each arm's compatibility default is the ablation alone's
    defaults = COMPATIBILITY_DEFAULTS["fae run"]
    assert {name: defaults[name] for name in ARM_FIELDS} == ABLATION_ONLY.record()
