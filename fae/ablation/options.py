"""`fae run`: its options (one dataclass), their command line and its YAML file.

:class:`FaeRunArguments` holds every option: the run's own (records, output,
rounds, ...) and the options each built-in backend declares
(:class:`~fae.backends.hf.HFOptions`, :class:`~fae.backends.openai_backend.OpenAIOptions`,
:class:`~fae.backends.vllm_backend.VLLMOptions`), so a default is written
once, where its backend is. The command line is generated from the fields by
the one generator of every command (:func:`real_fae_core.command.add_config_arguments`;
a backend's options under its own heading of ``--help``, every bool ``--x`` /
``--no-x``), and the precedence is the training one: field defaults < YAML
(``--config``) < command line. The YAML is read by the one strict loader
(:mod:`real_fae_core.config`): a key given twice, a typo'd key, a value of the
wrong type or out of its field's range is one line ``file:line: key: reason``
instead of reaching argparse, which never checks non-string defaults.

The command itself is :mod:`fae.ablation.runner` (``CONFIG``, ``parse_args``, ``run``).
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from real_fae_core.command import (CONFIG_FILE_HELP, CommandConfig, add_config_arguments, check_fields,
                                   parse_with_config_file)
from real_fae_core.config import RangeError, check_ranges, load_config, spelled_like_a_flag
from real_fae_core.errors import UserError
from real_fae_core.flags import KeyValueFlag
from real_fae_core.yamlio import load_yaml_located
from fae.ablation.engine import ARM_FIELDS, ArmOptions, Arms
from fae.backends import BackendOptions, get_backend
from fae.backends.hf import HFOptions
from fae.backends.openai_backend import OpenAIOptions
from fae.backends.options import backend_field
from fae.backends.vllm_backend import VLLMOptions

REQUIRED = ("records", "output", "model")
EXECUTORS = ("local", "ray")
DESCRIPTION = ("multi-round evidence ablation of a verifier (SPEC §6). Options come from the flags below and "
               "from a YAML file (--config): defaults < YAML < command line.")


@dataclass
class RunFields(ArmOptions):
    """The options of the run itself (the backends' options follow in :class:`FaeRunArguments`); the arms
    (``--control``, ``--gold-only``, ...) are :class:`~fae.ablation.engine.Arms`' own fields, inherited."""

    records: str | None = field(default=None, metadata={"help": "claim records (.jsonl, SPEC §2); required"})
    output: str | None = field(default=None, metadata={
        "help": "run directory (created; resumed if present); required", "metavar": "RUN_DIR"})
    backend: str = field(default="hf", metadata={"help": "hf, openai, vllm or a registered backend's name"})
    rounds: int = field(default=4, metadata={"help": "ablation rounds R after round 0", "min": 0})
    limit: int | None = field(default=None, metadata={"help": "only the first N records", "metavar": "N", "min": 1})
    chunk_size: int | None = field(default=None, metadata={
        "help": "claims in flight at once; each finished claim is written at once (None: one backend batch: "
                "--batch-size for hf, --concurrency for openai, 256 for vllm)", "min": 1})
    progress: bool = field(default=True, metadata={"help": "progress bars; --no-progress turns them off"})
    shard: str | None = field(default=None, metadata={
        "help": "run only shard I of N (0-based, e.g. 0/4) into RUN_DIR/shards/I-of-N; the same prompt-length-"
                "balanced deal on every machine; `fae merge RUN_DIR` joins the shards", "metavar": "I/N"})
    executor: str = field(default="local", metadata={
        "help": "local (this process) or ray (--shards N Ray tasks on the cluster at RAY_ADDRESS, or a local "
                "Ray; pip install 'real-fae[ray]')"})
    shards: int | None = field(default=None, metadata={
        "help": "--executor ray: number of shards (Ray tasks)", "metavar": "N", "min": 1})
    backend_args: dict | str | None = field(default=None, metadata={
        "help": "options of a registered (third-party) backend that fae run has no flag for: KEY=VALUE,KEY=VALUE "
                "on the command line (given again, its pairs are added; a KEY given twice with two values is an "
                "error), a mapping in YAML; checked against the backend's options class",
        "metavar": "KEY=VALUE,...", "action": KeyValueFlag})
    ray_gpus_per_shard: float = field(default=0.0, metadata={
        "help": "--executor ray: GPUs each shard's task asks Ray for (0: CPU only)", "min": 0})


@dataclass
class FaeRunArguments(HFOptions, OpenAIOptions, VLLMOptions, RunFields, CommandConfig):
    """Every `fae run` option (SPEC §6). Flags are the field names, ``_`` spelled ``-``.

    It is an instance of each built-in backend's options class, so a backend
    takes it as it is (:func:`fae.backends.backend_options`).
    """

    # every bool is --x / --no-x: a YAML file may set it either way, and the command line must undo that
    BOOL_ACTION = argparse.BooleanOptionalAction

    # the one underscore spelling the published docs and tests use, accepted (with a warning) until 0.2
    max_new_tokens: int = backend_field(BackendOptions, "max_new_tokens", deprecated=("--max_new_tokens",))

    def __post_init__(self):
        check_ranges(self)  # YAML values, flags and direct construction alike
        check_fields(self)  # and types, for a config built in code (`fae.ablation.runner.run(FaeRunArguments(...))`)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def make_parser(prog: str = "fae run") -> argparse.ArgumentParser:
    """The command line of :class:`FaeRunArguments` (:func:`~real_fae_core.command.add_config_arguments`: the
    run's own options first, then each backend's under its heading), plus ``--config`` (the YAML file, as TRL
    names it); ``--help`` shows every default. Building it imports no transformers."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, allow_abbrev=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_arguments(parser, FaeRunArguments)
    parser.add_argument("--config", metavar="YAML", help=CONFIG_FILE_HELP)
    return parser


def load_yaml_options(path: str) -> dict[str, Any]:
    """The options of a YAML file, keys as field names (``batch-size`` or ``batch_size``), values typed and checked."""
    return load_config(path, [FaeRunArguments], spell=spelled_like_a_flag)[0]


def parse_run_args(argv: list[str], prog: str = "fae run") -> tuple[FaeRunArguments, str | None]:
    """(options, the ``--config`` path or None); the required options must be given."""
    options, config = parse_options(argv, prog)
    require(options)
    return options, config


_BUILTIN_OPTIONS = {"hf": HFOptions, "openai": OpenAIOptions, "vllm": VLLMOptions}


def given_fields(argv: list[str]) -> set[str]:
    """Field names set on the command line (``--x``, ``--x=v``, ``--no-x``)."""
    names = {f.name for f in fields(FaeRunArguments)}
    out = set()
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            out.add(name[3:] if name.startswith("no_") and name[3:] in names else name)
    return out


def own_fields(backend: str) -> set[str]:
    """The fields a run with ``backend`` reads: its options class's and the run's own."""
    return {f.name for f in fields(get_backend(backend).options_class)} | {f.name for f in fields(RunFields)}


def owners() -> dict[str, list[str]]:
    """{field: the built-in backends whose options class declares it}."""
    out: dict[str, list[str]] = {}
    for name, cls in _BUILTIN_OPTIONS.items():
        for f in fields(cls):
            out.setdefault(f.name, []).append(name)
    return out


def check_backend_fields(backend: str, argv: list[str], config: str | None) -> None:
    """An option of another built-in backend, set for this one, is an error naming it: it would be ignored
    (``--tensor-parallel-size 2`` with ``--backend hf``). A registered backend's own fields count as its own."""
    origins = yaml_origins(config, shlex.join(argv))
    try:
        own = own_fields(backend)
    except UserError as exc:  # an unknown backend: where the YAML names it, when it does
        if "backend" in origins:
            raise UserError(f"{origins['backend'][0]}: {origins['backend'][1]}: {exc}") from None
        raise
    owner = owners()
    sources = [(given_fields(argv), lambda k: flag(k))]
    if config:
        sources.append((set(load_yaml_options(config)),
                        lambda k: "{}: {}".format(*origins.get(k, (config, k)))))
    for given, where in sources:
        for key in sorted(given):
            if key in owner and key not in own:
                raise UserError(f"{where(key)} is an option of --backend {' / '.join(owner[key])}; --backend "
                                f"{backend} does not read it (remove it, or choose that backend)")


def check_backend_values(options: FaeRunArguments) -> None:
    """The same refusal for a Python caller: an option of another built-in backend set away from its default
    (a config built in code has no command line to look at)."""
    own, owner = own_fields(options.backend), owners()
    defaults = {f.name: f.default for f in fields(FaeRunArguments)}  # one default per flag, whichever backend
    for key, backends in owner.items():
        if key in own or defaults.get(key, MISSING) is MISSING:
            continue
        if getattr(options, key) != defaults[key]:
            raise UserError(f"{key}={getattr(options, key)!r} is an option of --backend {' / '.join(backends)}; "
                            f"--backend {options.backend} does not read it (leave it at its default, or choose "
                            "that backend)")


def yaml_origins(config: str | None, command: str | None) -> dict[str, tuple[str, str]]:
    """{field: (``file:line``, the key as the YAML spells it)} of the options ``config`` set and the command
    line ``command`` (as config.json records it) did not override."""
    if not config:
        return {}
    data, lines = load_yaml_located(config)
    if not isinstance(data, dict):
        return {}
    try:
        given = given_fields(shlex.split(command)) if command else set()
    except ValueError:
        given = set()
    return {spelled_like_a_flag(str(k)): (f"{config}:{lines[(k,)]}" if (k,) in lines else str(config), str(k))
            for k in data if spelled_like_a_flag(str(k)) not in given}


_FLAG_FIRST = re.compile(r"--([A-Za-z0-9][A-Za-z0-9_-]*)[ =:]*(.*)", re.S)


def located_in_yaml(exc: UserError, config: str | None, command: str | None) -> UserError | None:
    """``exc`` (``--device 'x' is not a device ...``) said as a YAML error (``run.yaml:4: device: 'x' is not
    a device ...``) when the flag it starts with took its value from ``config``; None otherwise."""
    match = _FLAG_FIRST.match(str(exc))
    if not match or not config:
        return None
    origin = yaml_origins(config, command).get(match.group(1).replace("-", "_"))
    if origin is None:
        return None
    out = UserError(f"{origin[0]}: {origin[1]}: {match.group(2)}")
    out.exit_code = exc.exit_code
    return out


def require(options: FaeRunArguments) -> None:
    missing = [flag(k) for k in REQUIRED if not getattr(options, k)]
    if missing:
        raise UserError(f"missing {', '.join(missing)} (on the command line or in --config)")


def parse_options(argv: list[str], prog: str = "fae run") -> tuple[FaeRunArguments, str | None]:
    """(options, the ``--config`` path or None), required ones possibly unset (``fae checkpoints`` sets some).

    Precedence as in ``real.train``: defaults < YAML < flags
    (:func:`~real_fae_core.command.parse_with_config_file`). Unknown or malformed flags end with argparse's
    usual error (exit 2), and so does a flag out of its field's range; ``--help`` lists every option with its
    default.
    """
    parser = make_parser(prog)
    values, config, _from_file = parse_with_config_file(parser, argv, [FaeRunArguments])
    return options_of(parser, values), config


def options_of(parser: argparse.ArgumentParser, values: dict[str, Any]) -> FaeRunArguments:
    """:class:`FaeRunArguments` of parsed ``values``; a value out of its field's range is ``parser``'s usage
    error naming the flag (the YAML's values were checked by the loader already: this one is a flag's)."""
    try:
        return FaeRunArguments(**values)
    except RangeError as exc:
        parser.error(f"argument {flag(exc.key)}: {exc.problem}")


def parse_args(argv: list[str], prog: str = "fae run") -> tuple[FaeRunArguments, dict[str, Any]]:
    """(the options, ``{"command": the command line as given, "config_file": the --config YAML or None}``).

    Called by :func:`real_fae_core.cli.dispatch` instead of ``add_arguments`` (the YAML file is read before
    the command line). ``command`` is stored in config.json: the one to rerun to resume.
    """
    options, config = parse_run_args(argv, prog)
    check_backend_fields(options.backend, argv, config)  # another backend's option would be ignored
    return options, {"command": shlex.join([*prog.split(), *argv]), "config_file": config}


def arms_of(opts: FaeRunArguments) -> Arms:
    """The arms (control, gold-only, cited-only, size sweep) and line numbering of a run; an unknown value is
    one line."""
    try:
        return Arms(**{name: getattr(opts, name) for name in ARM_FIELDS})
    except ValueError as exc:
        raise UserError(str(exc)) from None
