"""`fae run` options: one dataclass, parsed the way `real.train` parses its recipes.

:class:`FaeRunArguments` holds every option; ``TrlParser`` (TRL's
``HfArgumentParser``) turns its fields into flags, so the precedence is the
training one: field defaults < YAML (``--config``) < command line. The YAML is
read strictly here (:func:`real_fae_core.yamlio.load_yaml`: a key given twice
is an error) and each value is checked against its field before it becomes a
parser default, so a typo'd key or a bad value names the file and the key
instead of reaching argparse, which never checks non-string defaults.

``trl`` is imported only when a parser is built: ``fae --help`` stays free of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from real_fae_core.errors import UserError

# Lower bounds, checked for YAML values, flags and direct construction alike.
MINIMUM: dict[str, int] = {
    "rounds": 0, "max_new_tokens": 1, "limit": 1, "chunk_size": 1, "batch_size": 1, "concurrency": 1,
    "max_retries": 0, "tensor_parallel_size": 1, "max_model_len": 1,
}
REQUIRED = ("records", "output", "model")
DESCRIPTION = ("multi-round evidence ablation of a verifier (SPEC §6). Options come from the flags below and "
               "from a YAML file (--config): defaults < YAML < command line.")


class OptionError(ValueError):
    """A value outside its option's range; ``key`` names the option."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


@dataclass
class FaeRunArguments:
    """Every `fae run` option (SPEC §6). Flags are the field names, with ``-`` or ``_``."""

    records: str | None = field(default=None, metadata={"help": "claim records (.jsonl, SPEC §2); required"})
    output: str | None = field(default=None, metadata={
        "help": "run directory (created; resumed if present); required", "metavar": "RUN_DIR"})
    backend: str = field(default="hf", metadata={"help": "hf, openai or vllm"})
    model: str | None = field(default=None, metadata={
        "help": "model path / name (hf, vllm) or served model name (openai); required"})
    adapter: str | None = field(default=None, metadata={"help": "PEFT LoRA adapter directory (hf, vllm)"})
    rounds: int = field(default=4, metadata={"help": "ablation rounds R after round 0"})
    max_new_tokens: int = field(default=64, metadata={"help": "answer length cap"})
    limit: int | None = field(default=None, metadata={"help": "only the first N records", "metavar": "N"})
    chunk_size: int | None = field(default=None, metadata={
        "help": "claims in flight at once; each finished claim is written at once (None: one backend batch: "
                "--batch-size for hf, --concurrency for openai, 256 for vllm)"})
    progress: bool = field(default=True, metadata={"help": "progress bars; --no-progress turns them off"})
    constrained_decoding: bool = field(default=False, metadata={
        "help": "hold every answer to the JSON schema of its prompt (label enum, ids of the pool shown); "
                "not the paper's protocol, see docs/structured.md"})
    label_probs: bool = field(default=True, metadata={
        "help": "per-round label probabilities (soft FAE); --no-label-probs skips them (hf: two extra forward "
                "passes per batch; openai: no logprobs request)"})
    # hf backend
    batch_size: int = field(default=8, metadata={"help": "hf: prompts per generate call"})
    device: str = field(default="auto", metadata={"help": "hf: auto, cpu, cuda, cuda:1 ..."})
    dtype: str = field(default="auto", metadata={"help": "hf: auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, fp32"})
    # openai backend
    base_url: str | None = field(default=None, metadata={
        "help": "openai: OpenAI-compatible endpoint, e.g. http://localhost:8000/v1"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "openai: environment variable holding the API key (the key itself is never stored)",
        "metavar": "VAR"})
    concurrency: int = field(default=8, metadata={"help": "openai: requests in flight"})
    request_timeout: float = field(default=60.0, metadata={"help": "openai: seconds per request"})
    max_retries: int = field(default=6, metadata={"help": "openai: retries on 429/5xx/timeouts/bad bodies"})
    backoff_base: float = field(default=1.0, metadata={"help": "openai: first backoff in seconds (doubles)"})
    seed: int | None = field(default=None, metadata={"help": "openai: sampling seed sent to the endpoint"})
    # vllm backend
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs per model"})
    gpu_memory_utilization: float | None = field(default=None, metadata={"help": "vllm: share of GPU memory"})
    max_model_len: int | None = field(default=None, metadata={"help": "vllm: context length cap"})

    def __post_init__(self):
        for name in MINIMUM:
            problem = range_problem(name, getattr(self, name))
            if problem:
                raise OptionError(name, problem)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(FaeRunArguments))


def range_problem(name: str, value: Any) -> str | None:
    lowest = MINIMUM.get(name)
    if lowest is None or value is None or value >= lowest:
        return None
    return f"must be >= {lowest}, got {value}"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def make_parser(prog: str = "fae run"):
    """``TrlParser`` over :class:`FaeRunArguments`, plus ``--config`` (TRL reserves that name for the file)."""
    from trl import TrlParser

    parser = TrlParser(FaeRunArguments, prog=prog, description=DESCRIPTION)
    parser.add_argument("--config", metavar="YAML", help="options from a YAML file (keys named like the flags); "
                                                         "flags given on the command line win")
    return parser


# ---------------------------------------------------------------------------
# YAML values
# ---------------------------------------------------------------------------

def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(FaeRunArguments)


def _plain(tp) -> tuple[type, bool]:
    """(the field's type, whether it may be null)."""
    args = typing.get_args(tp)
    if args:
        return next(a for a in args if a is not type(None)), type(None) in args
    return tp, False


def _convert(value: Any, tp: type) -> Any:
    """``value`` as ``tp`` the way the flag would read its text; ValueError when it cannot be."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if isinstance(value, (list, dict)) or (tp is not str and isinstance(value, bool)):
        raise ValueError(f"must be {'an integer' if tp is int else 'a number' if tp is float else 'a string'}, "
                         f"got {value!r}")
    if tp is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise ValueError(f"must be an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(str(value))
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
    return str(value)


def load_yaml_options(path: str) -> dict[str, Any]:
    """The options of a YAML file, keys as field names and values as their fields' types.

    Keys may be spelled like the flags (``batch-size``) or the fields
    (``batch_size``). An unknown key, a value of the wrong type or out of range
    is one :class:`UserError` line naming the file and the key.
    """
    from real_fae_core.yamlio import load_yaml

    data = load_yaml(path)  # missing file, directory, not UTF-8, bad YAML, a key twice: one line
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of option: value")
    types = _field_types()
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in types:
            close = difflib.get_close_matches(key, OPTION_NAMES, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(OPTION_NAMES)
            raise UserError(f"{path}: unknown key {raw_key!r} ({hint})")
        tp, nullable = _plain(types[key])
        if value is None:
            if not nullable:
                raise UserError(f"{path}: key {raw_key!r}: must not be empty (null)")
        else:
            try:
                value = _convert(value, tp)
            except ValueError as exc:
                raise UserError(f"{path}: key {raw_key!r}: {exc}") from None
            problem = range_problem(key, value)
            if problem:
                raise UserError(f"{path}: key {raw_key!r}: {problem}")
        out[key] = value
    return out


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

_UNSET = object()


class _InOrder(argparse.Namespace):
    """A namespace whose attributes follow the order argparse first set them to a real value."""

    def __setattr__(self, name: str, value: Any) -> None:
        if value is not _UNSET and self.__dict__.get(name, _UNSET) is _UNSET:
            self.__dict__.pop(name, None)
        super().__setattr__(name, value)


def given_options(argv: list[str], prog: str = "fae run") -> dict[str, Any]:
    """The options on the command line (``config`` included), in the order given.

    Every default is replaced by a marker, so an option is "given" exactly when
    a flag set it, even to its default value. Call it on an argv the real
    parser accepted (:func:`parse_run_args` does).
    """
    parser = make_parser(prog)
    parser.set_defaults(**{name: _UNSET for name in (*OPTION_NAMES, "config")})
    namespace = parser.parse_args(argv, namespace=_InOrder())
    return {k: v for k, v in vars(namespace).items() if v is not _UNSET}


def parse_run_args(argv: list[str], prog: str = "fae run") -> tuple[FaeRunArguments, str | None, dict[str, Any]]:
    """(options, the ``--config`` path or None, the options given on the command line).

    Precedence as in ``real.train``: defaults < YAML < flags; the YAML values
    become the parser's defaults through ``TrlParser.set_defaults_with_config``.
    Unknown or malformed flags end with argparse's usual error (exit 2);
    ``--help`` lists every option with its default.
    """
    parser = make_parser(prog)
    config = parser.parse_args(argv).config  # usage errors and --help first, with the true defaults
    given = given_options(argv, prog)
    if config:
        parser.set_defaults_with_config(**load_yaml_options(config))
    try:
        options, _extra = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except OptionError as exc:  # YAML values are checked already: this one is a flag's
        parser.error(f"argument {flag(exc.key)}: {exc.problem}")
    missing = [flag(k) for k in REQUIRED if not getattr(options, k)]
    if missing:
        raise UserError(f"missing {', '.join(missing)} (on the command line or in --config)")
    return options, config, given
