"""Backend options a diagnostic command embeds, declared once: where their backend declares them.

`fae probe`, `fae neurons`, `fae pave` and `fae study` put some of a backend's
options on their command line: their configs take the fields with
:func:`backend_field`, which copies the default, the help and the range from the
backend's options dataclass (its ``group``, the heading of ``--help``, and a bool's ``--x`` / ``--no-x``
included), so a default is still written once, and
:func:`~real_fae_core.command.add_config_arguments` declares their flags as every command's.
:func:`sampling_dtype` is the dtype such a command's answers are made in, which
`fae pave` and `fae study` record in their fingerprints.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fae.backends.hf import HFOptions, resolve_device, resolve_dtype
from fae.backends.openai_backend import OpenAIOptions
from fae.backends.vllm_backend import VLLMOptions


def backend_field(options_class: type, name: str, **metadata: Any) -> Any:
    """A dataclass field with the default and metadata (help, range) of ``options_class``'s field ``name``;
    ``metadata`` adds to it or overrides it (a command's own ``help``: :func:`real_fae_core.command.option`)."""
    f = {f.name: f for f in dataclasses.fields(options_class)}[name]
    meta = {**f.metadata, **metadata}
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=meta)
    return dataclasses.field(default=f.default, metadata=meta)


@dataclasses.dataclass
class HFLoadFields:
    """How the hf backend loads a model (``--device``, ``--dtype``, ``--trust-remote-code``), as `fae run` has them."""

    device: str = backend_field(HFOptions, "device")
    dtype: str = backend_field(HFOptions, "dtype")
    trust_remote_code: bool = backend_field(HFOptions, "trust_remote_code")


@dataclasses.dataclass
class VLLMServingFields:
    """The vLLM options a sampling command (`fae pave`, `fae study`) passes on."""

    tensor_parallel_size: int = backend_field(VLLMOptions, "tensor_parallel_size")
    gpu_memory_utilization: float | None = backend_field(VLLMOptions, "gpu_memory_utilization")
    max_model_len: int | None = backend_field(VLLMOptions, "max_model_len")


@dataclasses.dataclass
class OpenAIServingFields:
    """The OpenAI-compatible server's options a sampling command (`fae pave`, `fae study`) passes on."""

    base_url: str | None = backend_field(OpenAIOptions, "base_url")
    api_key_env: str | None = backend_field(OpenAIOptions, "api_key_env")
    concurrency: int = backend_field(OpenAIOptions, "concurrency")
    request_timeout: float = backend_field(OpenAIOptions, "request_timeout")
    max_retries: int = backend_field(OpenAIOptions, "max_retries")
    backoff_base: float = backend_field(OpenAIOptions, "backoff_base")


@dataclasses.dataclass
class ServingFields(OpenAIServingFields, VLLMServingFields):
    """The vLLM and OpenAI-compatible options a sampling command (`fae pave`, `fae study`) passes on (the vLLM
    ones first); each part is one argument group of its command line."""


def sampling_dtype(config: Any) -> str | None:
    """The dtype a sampling command's answers are made in: what ``--dtype`` resolves to on this machine (hf,
    vllm), None for openai (the server's). ``config``: a command config with ``backend`` and
    :class:`HFLoadFields`'s ``device`` and ``dtype`` (`fae pave`, `fae study`)."""
    if config.backend == "vllm":  # vLLM's auto is bf16
        return "bfloat16" if config.dtype == "auto" else config.dtype
    if config.backend == "hf":
        return str(resolve_dtype(config.dtype, resolve_device(config.device))).replace("torch.", "")
    return None
