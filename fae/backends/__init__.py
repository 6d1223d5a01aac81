"""Verifier backends behind one small interface, found through a registry.

A backend turns chat prompts into answers::

    backend = get_backend("hf")(options)      # its options dataclass, or a mapping of its fields
    answers = backend.generate(list_of_messages, callback=progress_update)

Each backend declares its options once, as a dataclass (``options_class``:
:class:`BackendOptions` and its subclasses ``HFOptions``, ``OpenAIOptions``,
``VLLMOptions``), the way vLLM's ``EngineArgs`` and lm-eval's ``model_args``
do: names, types, defaults and ranges (field metadata, checked by
:mod:`real_fae_core.config`). ``fae run``'s ``FaeRunConfig`` is built from
the built-in ones; a mapping (a test, the training callback, ``fae pave``) is
turned into the backend's options by :func:`backend_options`, keeping the
keys that are its fields and checking their values.

An answer is a :class:`Generation` (text + why generation stopped, as vLLM's
and the OpenAI API's ``finish_reason``) or a plain string: third-party
backends that return strings keep working, their answers just do not say
whether they were cut off (:func:`as_generation`).

A backend may also attach the verifier's label probabilities (soft FAE,
:mod:`fae.backends.label_probs`); ``label_probs: false`` in the options turns that off.

``generate_rows(prompts, decodings)`` decodes each prompt as its :class:`RowDecoding` says, greedy or
sampled from a seed of its own, for the evaluation-choice study (SPEC §10, docs/study.md): hf, openai
and vllm implement it so that a sample depends on its seed, not on the batch it ran in; ``generate``
stays greedy.

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


# The answer length cap of every FAE path (fae run, its checkpoints callback, pave, the Inspect task): a JSON
# answer with a label and a few ids fits; a longer one is cut off and counted as truncated.
ANSWER_MAX_NEW_TOKENS = 64


@dataclass
class BackendOptions:
    """The options every backend reads: the verifier, the answer cap, soft FAE, constrained decoding."""

    model: str | None = field(default=None, metadata={
        "help": "model path / name (hf, vllm) or served model name (openai); required"})
    adapter: str | None = field(default=None, metadata={"help": "PEFT LoRA adapter directory (hf, vllm)"})
    max_new_tokens: int = field(default=ANSWER_MAX_NEW_TOKENS, metadata={"help": "answer length cap", "min": 1})
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
    # per-prompt decoding (Backend.generate_rows): the settings this answer was decoded with, as sent to
    # the server or the sampler (a server that refused top_k shows none); None for plain ``generate``
    decoding: dict | None = None

    @property
    def truncated(self) -> bool | None:
        """Cut off at ``max_new_tokens``; None when the backend did not say."""
        return None if self.finish_reason is None else self.finish_reason == "length"


@dataclass(frozen=True)
class RowDecoding:
    """How one prompt of :meth:`Backend.generate_rows` is decoded: greedy (``seed`` None) or sampled.

    The evaluation-choice study (SPEC §10) answers the same prompt greedily and with several seeded
    samples, so the decoding belongs to the prompt, not to the backend. A sampled row draws from a
    random stream of its own, seeded by ``seed``, so its answer depends on the prompt and the seed only,
    never on which other prompts share its batch or in what order they come (docs/study.md).
    ``top_k`` 0 and ``top_p`` 1 switch those filters off; ``max_new_tokens`` None is the backend's cap.
    """

    seed: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None

    def __post_init__(self):
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed {self.seed!r}: a whole number in [0, 2**63)")
        if not self.temperature > 0:
            raise ValueError(f"temperature {self.temperature!r}: must be above 0 (greedy is seed None)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p!r}: must be in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k {self.top_k!r}: a whole number >= 0 (0: off)")
        if self.max_new_tokens is not None and not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens {self.max_new_tokens!r}: a whole number >= 1")

    @property
    def greedy(self) -> bool:
        """Whether the row is decoded greedily (no ``seed``); temperature, top_p and top_k then do not apply."""
        return self.seed is None

    def settings(self, max_new_tokens: int) -> dict[str, Any]:
        """What identifies this row's answers (``max_new_tokens``: the cap it ran under), for the records."""
        if self.greedy:
            return {"greedy": True, "max_new_tokens": max_new_tokens}
        return {"greedy": False, "seed": self.seed, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "max_new_tokens": max_new_tokens}


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
        """One answer per prompt, in the prompts' order, greedy at the backend's cap; ``callback(n)`` is called
        as ``n`` more prompts are answered. Raises :class:`BackendError` when an answer cannot be had."""
        raise NotImplementedError

    def __call__(self, prompts, callback=None):
        return self.generate(prompts, callback=callback)

    def generate_rows(
        self, prompts: list[list[Message]], decodings: list[RowDecoding],
        callback: Callable[[int], None] | None = None,
    ) -> list[Generation | str]:
        """One answer per prompt, each decoded as its :class:`RowDecoding` says (greedy or seeded sampling).

        The built-in backends sample each row from its own seed; a backend that cannot still answers
        rows that are all greedy at its own cap (through ``generate``) and refuses anything else, so no
        study runs with samples that are not what their seeds say.
        """
        if len(prompts) != len(decodings):
            raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        if all(d.greedy and d.max_new_tokens in (None, self.options.max_new_tokens) for d in decodings):
            return self.generate(prompts, callback=callback)
        raise UserError(f"the {self.name} backend cannot decode each prompt its own way "
                        "(seeded sampling, a cap per prompt): use hf, openai or vllm")

    @classmethod
    def decoding_of(cls, options: BackendOptions) -> dict[str, Any]:
        """Settings that change the answers (a resume must match them); no model loaded."""
        return {"greedy": True, "max_new_tokens": options.max_new_tokens}

    @classmethod
    def check_ready(cls, options: BackendOptions) -> None:
        """Refuse, as one :class:`UserError` line, what would make loading fail whatever the prompts (a package
        not installed, no GPU), so a command can check before it writes anything; nothing is loaded."""

    @classmethod
    def default_chunk_size(cls, options: BackendOptions) -> int:
        """Claims in flight when ``--chunk-size`` is not given: one backend batch (what a kill may cost)."""
        return 256

    def close(self) -> None:
        """Free what the backend holds (a model, a client, worker processes); the base holds nothing."""
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

    ``values`` is that dataclass (``FaeRunConfig`` is one of every built-in's),
    another dataclass (its fields are copied) or a mapping.
    """
    cls = backend_cls.options_class
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values):
        values = dataclasses.asdict(values)
    return options_from(cls, values, source=f"--backend {backend_cls.name} options")


def available() -> list[str]:
    """The names ``--backend`` accepts: the built-ins (loaded or not) and every registered one, sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def get_backend(name: str) -> type:
    """The backend class registered as ``name`` (a built-in's module is imported on first use);
    an unknown name is a :class:`UserError` listing the available ones."""
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(available())})")
    return _REGISTRY[name]
