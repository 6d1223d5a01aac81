"""Verifier backends behind one small interface, found through a registry.

A backend turns chat prompts into answers::

    backend = get_backend("hf")(options)      # its options dataclass, or a mapping of its fields
    answers = backend.generate(list_of_messages, callback=progress_update)

Each backend declares its options once, as a dataclass (``options_class``:
:class:`BackendOptions` and its subclasses ``HFOptions``, ``OpenAIOptions``,
``VLLMOptions``), the way vLLM's ``EngineArgs`` and lm-eval's ``model_args``
do: names, types, defaults and ranges (field metadata, checked by
:mod:`real_fae_core.config`). ``fae run``'s ``FaeRunArguments`` is built from
the built-in ones; a mapping (a test, the training callback, ``fae pave``) is
turned into the backend's options by :func:`backend_options`, keeping the
keys that are its fields and checking their values.

An answer is a :class:`Generation` (text + why generation stopped, as vLLM's
and the OpenAI API's ``finish_reason``) or a plain string: third-party
backends that return strings keep working, their answers just do not say
whether they were cut off (:func:`as_generation`).

A backend may also attach the verifier's label probabilities (soft FAE,
:mod:`fae.backends.label_probs`); ``label_probs: false`` in the options turns that off.

``decoding_of(options)`` (typed options) returns the decoding settings that identify the
answers (for config.json and the resume check), ``stats`` counts backend events (retries, ...) for the run
log, ``default_chunk_size(options)`` the claims in flight when ``--chunk-size``
is not given, and ``close()`` frees resources. A third-party backend subclasses
:class:`Backend`, sets ``options_class`` to its own subclass of
:class:`BackendOptions` and calls :func:`register` (as a decorator): its
options are checked like the built-ins'.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from real_fae_core.config import options_from
from real_fae_core.errors import UserError

Message = dict[str, str]

_BUILTIN = {
    "hf": "fae.backends.hf",
    "openai": "fae.backends.openai_backend",
    "vllm": "fae.backends.vllm_backend",
}
_REGISTRY: dict[str, type] = {}


@dataclass
class BackendOptions:
    """The options every backend reads: the verifier, the answer cap, soft FAE, constrained decoding."""

    model: str | None = field(default=None, metadata={
        "help": "model path / name (hf, vllm) or served model name (openai); required"})
    adapter: str | None = field(default=None, metadata={"help": "PEFT LoRA adapter directory (hf, vllm)"})
    max_new_tokens: int = field(default=64, metadata={"help": "answer length cap", "min": 1})
    constrained_decoding: bool = field(default=False, metadata={
        "help": "hold every answer to the JSON schema of its prompt (label enum, ids of the pool shown); "
                "not the paper's protocol, see docs/structured.md"})
    label_probs: bool = field(default=True, metadata={
        "help": "per-round label probabilities (soft FAE); --no-label-probs skips them (hf: two extra forward "
                "passes per batch; openai: no logprobs request)"})


@dataclass(frozen=True)
class Generation:
    """One answer and why generation stopped: ``"stop"``, ``"length"`` (hit ``max_new_tokens``) or None (unknown)."""

    text: str
    finish_reason: str | None = None
    # soft FAE: label -> probability at the answer's label position (normalised over the three
    # labels) and the unnormalised log-probabilities; None when not computed, with the reason
    label_probs: dict | None = None
    label_logprobs: dict | None = None
    label_probs_skipped: str | None = None

    @property
    def truncated(self) -> bool | None:
        """Cut off at ``max_new_tokens``; None when the backend did not say."""
        return None if self.finish_reason is None else self.finish_reason == "length"


def as_generation(answer: Any) -> Generation:
    """A backend's answer as a :class:`Generation` (a plain string: reason unknown; anything else: empty)."""
    if isinstance(answer, Generation):
        return answer
    return Generation(answer if isinstance(answer, str) else "")


class BackendError(RuntimeError):
    """A backend could not produce an answer (after its retries)."""


class Backend:
    """Base class: subclasses implement ``generate``; the rest has defaults."""

    name = "base"
    options_class: type = BackendOptions

    def __init__(self, options: BackendOptions | Mapping[str, Any]):
        self.options = backend_options(type(self), options)
        self.stats: dict[str, int] = {}

    def generate(
        self, prompts: list[list[Message]], callback: Callable[[int], None] | None = None
    ) -> list[Generation | str]:
        raise NotImplementedError

    def __call__(self, prompts, callback=None):
        return self.generate(prompts, callback=callback)

    @classmethod
    def decoding_of(cls, options: BackendOptions) -> dict[str, Any]:
        """Settings that change the answers (a resume must match them); no model loaded."""
        return {"greedy": True, "max_new_tokens": options.max_new_tokens}

    @classmethod
    def default_chunk_size(cls, options: BackendOptions) -> int:
        """Claims in flight when ``--chunk-size`` is not given: one backend batch (what a kill may cost)."""
        return 256

    def close(self) -> None:
        pass


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a backend available as ``--backend NAME``."""

    def deco(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def backend_options(backend_cls: type, values: Any) -> BackendOptions:
    """``values`` as ``backend_cls.options_class``: an instance of it as is, else its fields picked and checked.

    ``values`` is that dataclass (``FaeRunArguments`` is one of every built-in's),
    another dataclass (its fields are copied) or a mapping.
    """
    cls = backend_cls.options_class
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values):
        values = dataclasses.asdict(values)
    return options_from(cls, values, source=f"--backend {backend_cls.name} options")


def available() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def get_backend(name: str) -> type:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(available())})")
    return _REGISTRY[name]
