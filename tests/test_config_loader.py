"""The one strict config loader (real_fae_core.config) and typed backend options, a third-party backend's included."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from helpers import make_record_dict

from real_fae_core.config import RangeError, check_ranges, load_config, spelled_like_a_flag
from real_fae_core.errors import UserError
from fae.ablation.runio import read_claims
from fae.backends import Backend, BackendOptions, backend_options, get_backend, register
from fae.backends.hf import HFOptions
from fae.cli import main


@dataclass
class Knobs:
    name: str
    steps: int = field(default=10, metadata={"min": 1})
    rate: float = field(default=0.5, metadata={"above": 0, "below": 1})
    tags: list[str] | None = None
    warm_up: int = 0


def write(tmp_path, text: str):
    path = tmp_path / "knobs.yaml"
    path.write_text(text)
    return path


def test_values_take_their_field_types_and_keys_their_lines(tmp_path):
    path = write(tmp_path, "name: a\nsteps: 2.0\nrate: 1e-1\ntags: [x, y]\n")
    values, lines = load_config(path, [Knobs])
    assert values == {"name": "a", "steps": 2, "rate": 0.1, "tags": ["x", "y"]}
    assert isinstance(values["steps"], int) and lines[("rate",)] == 3
    assert Knobs(**values).rate == 0.1


@pytest.mark.parametrize("text, message", [
    ("name: a\nstep: 3\n", "knobs.yaml:2: step: unknown key (did you mean 'steps'?)"),
    ("name: a\nsteps: 2.5\n", "knobs.yaml:2: steps: must be a whole number, got 2.5"),
    ("name: a\nsteps: 0\n", "knobs.yaml:2: steps: must be >= 1, got 0"),
    ("name: a\n\nrate: 1\n", "knobs.yaml:3: rate: must be < 1, got 1.0"),
    ("name: a\nrate: -0.0\n", "knobs.yaml:2: rate: must be > 0, got -0.0"),
    ("name: a\nrate: fast\n", "knobs.yaml:2: rate: must be a number, got 'fast'"),
    ("name: [a]\n", "knobs.yaml:1: name: must be a string, got a list ['a']"),
    ("name: a\ntags: [x, [y]]\n", "knobs.yaml:2: tags: list items must be a string, got ['y']"),
    ("steps: 3\n", "knobs.yaml: name: missing required field"),
    ("name: a\nsteps: 1\nsteps: 2\n", "knobs.yaml:3: key 'steps' is given twice (lines 2 and 3)"),
    ("- name\n", "knobs.yaml: expected a mapping of option: value"),
])
def test_every_mistake_is_one_line_naming_file_line_and_field(tmp_path, text, message):
    with pytest.raises(UserError) as err:
        load_config(write(tmp_path, text), [Knobs])
    assert str(err.value) == f"{tmp_path}/{message}"


def test_flag_spelling_and_pass_through_keys(tmp_path):
    values, _ = load_config(write(tmp_path, "name: a\nenv: {X: 1}\n"), [Knobs], extra=("env",))
    assert values["env"] == {"X": 1}
    spelled, _ = load_config(write(tmp_path, "name: a\nwarm-up: 3\n"), [Knobs], spell=spelled_like_a_flag)
    assert spelled["warm_up"] == 3


def test_ranges_hold_for_direct_construction_too():
    @dataclass
    class Checked(Knobs):
        def __post_init__(self):
            check_ranges(self)

    with pytest.raises(RangeError, match=r"^steps: must be >= 1, got 0$"):
        Checked(name="a", steps=0)


def test_each_builtin_backend_declares_its_options_once():
    from fae.ablation.runner import FaeRunConfig

    run = FaeRunConfig()
    for name in ("hf", "openai", "vllm"):
        cls = get_backend(name).options_class
        assert isinstance(run, cls)  # `fae run`'s options are every built-in's options, defaults included
        assert backend_options(get_backend(name), run) is run
    assert (run.batch_size, run.concurrency, run.tensor_parallel_size) == (8, 8, 1)
    hf = backend_options(get_backend("hf"), {"batch_size": 3, "concurrency": 2})  # not hf's: ignored
    assert hf == HFOptions(batch_size=3)
    with pytest.raises(UserError, match=r"^--backend hf options: batch_size: must be >= 1, got 0$"):
        backend_options(get_backend("hf"), {"batch_size": 0})


@dataclass
class EchoOptions(BackendOptions):
    label: str = field(default="SUPPORT", metadata={"help": "the label every answer gives"})
    chunk: int = field(default=2, metadata={"min": 1})


@register("test-echo")
class EchoBackend(Backend):
    """A third-party backend with options of its own: the same label for every prompt."""

    options_class = EchoOptions
    chunks: list[int] = []

    def generate(self, prompts, callback=None):
        EchoBackend.chunks.append(len(prompts))
        if callback:
            callback(len(prompts))
        return [json.dumps({"label": self.options.label, "evidence": [0]}) for _ in prompts]

    @classmethod
    def decoding_of(cls, options):
        return {"greedy": True, "max_new_tokens": options.max_new_tokens, "label": options.label}

    @classmethod
    def default_chunk_size(cls, options):
        return options.chunk


def test_a_third_party_backend_gets_its_options_checked_and_used(tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps(make_record_dict(id=f"r{i}")) + "\n" for i in range(5)))
    out = tmp_path / "run"
    argv = ["run", "--backend", "test-echo", "--model", "x", "--records", str(records), "--output", str(out),
            "--rounds", "1", "--max-new-tokens", "9", "--no-progress",
            # the ablation alone: one prompt per claim in flight, so a call's size is the chunk
            "--control", "none", "--no-gold-only", "--no-cited-only", "--no-size-sweep"]
    EchoBackend.chunks.clear()
    assert main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["decoding"] == {"greedy": True, "max_new_tokens": 9, "label": "SUPPORT"}
    assert cfg["command"] == "fae run " + " ".join(argv[1:])  # as given, not rebuilt
    assert max(EchoBackend.chunks) <= 2  # its own default chunk size, from its own options
    assert [c["rounds"][0]["label"] for c in read_claims(out / "claims.jsonl")] == ["SUPPORT"] * 5
    with pytest.raises(UserError, match="--backend test-echo options: chunk: must be >= 1, got 0"):
        EchoBackend({"chunk": 0})


def test_option_flags_come_from_the_dataclass_fields():
    """A command that loads a model declares a backend's options from its dataclass: same names, types,
    defaults and help as `fae run`, and the values build the backend's options unchanged."""
    import argparse

    from real_fae_core.command import add_config_arguments
    from real_fae_core.config import options_from
    from fae.backends.hf import HFOptions
    from fae.backends.vllm_backend import VLLMOptions

    p = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(p, HFOptions, ["batch_size", "dtype", "trust_remote_code", "model"])
    add_config_arguments(p, VLLMOptions, ["gpu_memory_utilization"])
    args = p.parse_args(["--batch-size", "3", "--trust-remote-code", "--gpu-memory-utilization", "0.5"])
    assert (args.batch_size, args.dtype, args.trust_remote_code, args.model) == (3, "auto", True, None)
    assert args.gpu_memory_utilization == 0.5 and isinstance(args.gpu_memory_utilization, float)
    assert p.parse_args(["--no-trust-remote-code"]).trust_remote_code is False
    opts = options_from(HFOptions, vars(args))
    assert opts.batch_size == 3 and opts.trust_remote_code is True
    with pytest.raises(SystemExit):
        p.parse_args(["--batch-size", "many"])
    with pytest.raises(UserError, match="batch_size"):  # ranges are the dataclass's, checked once
        options_from(HFOptions, vars(p.parse_args(["--batch-size", "0"])))
    assert "prompts per generate call" in p.format_help()


def test_a_third_party_backends_own_options_from_the_command_line_and_yaml(tmp_path, capsys):
    """`fae run` has no flag for a registered backend's own fields: --backend-args (a mapping in YAML)."""
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps(make_record_dict(id=f"r{i}")) + "\n" for i in range(3)))
    base = ["run", "--backend", "test-echo", "--model", "x", "--records", str(records), "--rounds", "1",
            "--no-progress"]
    assert main([*base, "--output", str(tmp_path / "cli"), "--backend-args", "label=REFUTE,chunk=1"]) == 0
    cfg = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert cfg["decoding"]["label"] == "REFUTE"  # the backend's option reached it (and the fingerprint)
    assert {c["rounds"][0]["label"] for c in read_claims(tmp_path / "cli" / "claims.jsonl")} == {"REFUTE"}
    yaml_file = tmp_path / "echo.yaml"
    yaml_file.write_text("backend_args:\n  label: NOT_ENOUGH_INFO\n  chunk: 2\n")
    assert main([*base, "--output", str(tmp_path / "yaml"), "--config", str(yaml_file)]) == 0
    assert json.loads((tmp_path / "yaml" / "config.json").read_text())["decoding"]["label"] == "NOT_ENOUGH_INFO"
    capsys.readouterr()
    for args, message in ((["--backend-args", "colour=red"], "colour is not an option of --backend test-echo "
                                                                "(its own options: chunk, label)"),
                          (["--backend-args", "rounds=2"], "rounds has its own flag: --rounds"),
                          (["--backend-args", "label"], "'label' is not KEY=VALUE"),
                          (["--backend-args", "chunk=0"], "--backend-args: chunk: must be >= 1, got 0")):
        assert main([*base, "--output", str(tmp_path / "bad"), *args]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "claims.jsonl").exists()
