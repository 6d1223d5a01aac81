"""Verifier backends behind one small interface, found through a registry.

A backend turns chat prompts into answers::

    backend = get_backend("hf")(options)      # options: the merged `fae run` settings
    answers = backend.generate(list_of_messages, callback=progress_update)

An answer is a :class:`Generation` (text + why generation stopped, as vLLM's
and the OpenAI API's ``finish_reason``) or a plain string: third-party
backends that return strings keep working, their answers just do not say
whether they were cut off (:func:`as_generation`).

A backend may also attach the verifier's label probabilities (soft FAE,
:mod:`fae.backends.label_probs`); ``label_probs: false`` in the options turns that off.

``decoding_of(options)`` returns the decoding settings that identify the
answers (for config.json and the resume check), ``stats`` counts backend events (retries, ...) for the run
log, and ``close()`` frees resources. Built-ins are imported lazily on first
use, so ``vllm`` is only imported when the ``vllm`` backend is asked for;
third-party backends call :func:`register` (as a decorator) to plug in.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from real_fae_core.errors import UserError

Message = dict[str, str]

_BUILTIN = {
    "hf": "fae.backends.hf",
    "openai": "fae.backends.openai_backend",
    "vllm": "fae.backends.vllm_backend",
}
_REGISTRY: dict[str, type] = {}


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


def wants_label_probs(options: dict[str, Any]) -> bool:
    """Soft FAE is on unless the run says ``label_probs: false`` (``--no-label-probs``)."""
    return options.get("label_probs", True) is not False


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

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.stats: dict[str, int] = {}

    def generate(
        self, prompts: list[list[Message]], callback: Callable[[int], None] | None = None
    ) -> list[Generation | str]:
        raise NotImplementedError

    def __call__(self, prompts, callback=None):
        return self.generate(prompts, callback=callback)

    @classmethod
    def decoding_of(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Settings that change the answers (a resume must match them); no model loaded."""
        return {"greedy": True, "max_new_tokens": int(options.get("max_new_tokens") or 64)}

    def close(self) -> None:
        pass


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a backend available as ``--backend NAME``."""

    def deco(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def get_backend(name: str) -> type:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _REGISTRY:
        raise UserError(f"unknown backend {name!r} (available: {', '.join(available())})")
    return _REGISTRY[name]
