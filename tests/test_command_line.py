"""The command line of a config (real_fae_core.command.command_line), the option generator's inverse.

A run records the command that resumes it; a Python caller's run has no command line of its own, so the
line is made from its config. The property: for random configs of the commands, the line parsed by the
command's own parser gives back an equal config. Fast: no model.
"""

from __future__ import annotations

import dataclasses
import shlex
import types
import typing

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from real_fae_core.command import command_line
from real_fae_core.flags import SpacedList
from real_fae_core.secrets import register_secret

from command_walk import command_parsers

COMMANDS = command_parsers()
# Commands whose runs record a command line (and a few more), parsed by the parser their entry point builds.
ROUND_TRIP = ("fae run", "fae pave", "fae study", "fae merge", "fae from-inspect", "real-data enhance",
              "real-data counterfactual", "fae report", "fae compare")
# Words that keep a generated value clear of the secret shapes the line is scrubbed of (no `@`: no URL
# password; at most 7 characters: no `bearer x` / `api_key=x`).
WORDS = st.text(st.sampled_from("abcXYZ019 -_=./:,'\""), max_size=7).filter(lambda w: w != "--")


def _base(tp):
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _scalar(tp, f: dataclasses.Field):
    meta = f.metadata
    if "choices" in meta:
        return st.sampled_from(list(meta["choices"]))
    if typing.get_origin(tp) is typing.Literal:
        return st.sampled_from(list(typing.get_args(tp)))
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo = meta.get("min", meta["above"] + 1 if "above" in meta else -5)
        hi = meta.get("max", meta["below"] - 1 if "below" in meta else lo + 1000)
        return st.integers(lo, hi)
    if tp is float:
        lo = meta.get("min", meta.get("above", -1e6))
        hi = meta.get("max", meta.get("below", 1e6))
        return st.floats(lo, hi, allow_nan=False, exclude_min="above" in meta, exclude_max="below" in meta)
    if tp is str:
        return WORDS
    return None


def _strategy(f: dataclasses.Field, tp):
    """Values of field ``f`` that its command line can say, or None to leave it at its default."""
    base, optional = _base(tp)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if typing.get_origin(base) is list:
        item = _scalar(typing.get_args(base)[0], f)
        if item is None:
            return None
        if isinstance(f.metadata.get("action"), type) and issubclass(f.metadata["action"], SpacedList):
            item = item.filter(lambda v: "," not in str(v))  # a comma list is split (deprecated spelling)
        many = st.lists(item, min_size=1, max_size=3)
        if f.metadata.get("repeat", True) is False:  # given once: its items must not read as options
            many = st.lists(item.filter(lambda v: not str(v).startswith("-")), min_size=1, max_size=3)
        return st.one_of(st.just(default), many) if default is not dataclasses.MISSING else many
    value = _scalar(base, f)
    if value is None:
        return None
    if base is bool and default is None:
        return st.sampled_from([None, True])
    if optional and default is None:
        return st.one_of(st.none(), value)
    return value


def _configs(prog: str):
    cls = COMMANDS[prog].config
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        strategy = _strategy(f, hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if strategy is None:
            assert not required, f"{prog}: {f.name}: no values for a required field"
            continue
        fields[f.name] = strategy
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def parse(prog: str, line: str):
    """The config the command's own parser makes of ``line``."""
    _module, cls, parser = COMMANDS[prog]
    words = shlex.split(line)
    assert words[:len(prog.split())] == prog.split(), line
    argv = words[len(prog.split()):]
    if cls.config_file_types():  # `fae run`: its --config is no field; no check of the whole command line
        values = {k: v for k, v in vars(parser.parse_args(argv)).items() if k != "config"}
        return cls.from_parsed(values, parser, {})
    return cls.from_namespace(parser.parse_args(argv))


@pytest.mark.parametrize("prog", ROUND_TRIP)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_config_is_what_its_command_line_parses_to(prog, data):
    config = data.draw(_configs(prog))
    line = command_line(prog, config)
    assert parse(prog, line) == config, line


def test_only_changed_options_are_written_and_the_line_reads_like_one_typed():
    from fae.study.runner import StudyConfig

    config = StudyConfig(pools="p d", output="o", model="m", budgets=[100, 200], seeds=[-1, 2],
                         tokenizer=["a", "b"], progress=False)
    assert command_line("fae study", config) == ("fae study --pools 'p d' --output o --model m --budgets 100 200 "
                                                 "--seeds=-1 --seeds 2 --tokenizer a --tokenizer b --no-progress")


def test_positional_arguments_come_first_and_bools_use_the_generators_spelling():
    from fae.ablation.merge import MergeConfig
    from fae.pave.runner import PaveConfig

    assert command_line("fae merge", MergeConfig(run_dir="runs/a", shards=2)) == "fae merge runs/a --shards 2"
    assert command_line("fae merge", MergeConfig(run_dir="-a")) == "fae merge -- -a"
    pave = PaveConfig(records="r", output="o", model="m", constrained_decoding=True, keep_refusals=True)
    assert command_line("fae pave", pave) == "fae pave --records r --output o --model m --keep-refusals " \
                                             "--constrained-decoding"


def test_secrets_never_reach_the_line():
    from fae.pave.runner import PaveConfig

    register_secret("sk-never-shown-1234")
    config = PaveConfig(records="r", output="o", model="sk-never-shown-1234", backend="openai",
                        base_url="https://user:hunter2@host/v1")
    line = command_line("fae pave", config)
    assert "hunter2" not in line and "sk-never-shown" not in line
    assert "https://user:***@host/v1" in line


def test_a_value_the_parser_cannot_say_is_refused():
    from fae.study.runner import StudyConfig

    with pytest.raises(ValueError, match="budgets: \\[\\] has no command line spelling"):
        command_line("fae study", StudyConfig(pools="p", output="o", model="m", budgets=[]))
