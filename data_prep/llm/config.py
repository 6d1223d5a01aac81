"""Annotator YAML: which models annotate, where they live, how hard to push them.

The file names the *environment variable* that holds each key, never the
key, so recipes can be committed and shared; a keyless local server (llama.cpp,
vLLM without ``--api-key``) needs no variable at all. Each entry is checked
against :class:`AnnotatorConfig` by the project's one strict loader
(:mod:`real_fae_core.config`: unknown fields, types, ranges in the field
metadata, a key given twice). Errors name the file and line, the entry index
(and name when known) and the field: ``file:line: annotators[1] ('b'): field: reason``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from real_fae_core.config import check_mapping, locator
from real_fae_core.errors import UserError
from real_fae_core.openai_client import NO_KEY
from real_fae_core.secrets import read_key, register_secret
from real_fae_core.yamlio import load_yaml_located

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """A bad annotators file or a missing key variable: one clear sentence."""


@dataclass(frozen=True)
class AnnotatorConfig:
    """One annotator LLM behind an OpenAI-compatible ``/v1/chat/completions``."""

    name: str
    base_url: str
    model: str
    max_concurrency: int = field(metadata={"min": 1})
    temperature: float = field(metadata={"min": 0.0})
    max_tokens: int = field(metadata={"min": 1})
    api_key_env: str | None = None  # None: a keyless server (llama.cpp, vLLM without --api-key)
    timeout: float = field(default=60.0, metadata={"above": 0.0})  # seconds per HTTP request
    # transport retries (429, 5xx, timeouts, connection errors)
    max_retries: int = field(default=6, metadata={"min": 0})
    # re-asks after an unparseable answer, then abstain
    malformed_retries: int = field(default=2, metadata={"min": 0})
    # seconds; delay ~ U(0, min(backoff_max, base * 2**attempt))
    backoff_base: float = field(default=1.0, metadata={"min": 0.0})
    backoff_max: float = field(default=60.0, metadata={"min": 0.0})
    seed: int | None = None  # sent when set (vLLM and OpenAI honour it)
    # answers held to {"evidence": [ids of the pool]} through response_format (docs/structured.md)
    constrained_decoding: bool = False

    def decoding(self) -> dict[str, Any]:
        """Decoding settings of every request (and part of the cache key).

        ``constrained_decoding`` appears only when on, so caches of unconstrained
        annotators keep their keys; the client turns it into ``response_format``.
        """
        out: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.seed is not None:
            out["seed"] = self.seed
        if self.constrained_decoding:
            out["constrained_decoding"] = True
        return out

    @property
    def endpoint(self) -> str:
        """How errors name this annotator's server: base URL and model, never the key."""
        return f"{self.base_url} (model {self.model!r})"

    def api_key(self) -> str:
        """The key from the environment (registered for scrubbing); the error names the variable, never a value."""
        if self.api_key_env is None:
            return NO_KEY
        value = read_key(self.api_key_env)
        if value is None:
            raise ConfigError(
                f"annotator {self.name!r} reads its API key from the environment variable "
                f"{self.api_key_env}, which is not set (for a server that checks no key, "
                f"such as llama.cpp or vLLM without --api-key, remove 'api_key_env' from the entry)"
            )
        return value


def _check_entry(raw: Any, path: Path, lines: dict[tuple, int], i: int) -> AnnotatorConfig:
    """``annotators[i]`` as an :class:`AnnotatorConfig`; an absent or null optional field takes its default."""
    where = f"annotators[{i}]"
    if isinstance(raw, dict) and isinstance(raw.get("name"), str) and raw["name"]:
        where = f"{where} ({raw['name']!r})"

    place = locator(path, lines, ("annotators", i))

    def at(key) -> str:
        return f"{place(key)}: {where}"

    def bad(fld: str, reason: str):
        raise ConfigError(f"{at(fld)}: {fld}: {reason}")

    if not isinstance(raw, dict):
        raise ConfigError(f"{at(None)}: must be a mapping with fields name, base_url, model, max_concurrency, "
                          "temperature, max_tokens")
    if "api_key" in raw:
        bad("api_key", "keys never go into this file; name the environment variable in 'api_key_env'")
    try:
        kwargs = check_mapping({k: v for k, v in raw.items() if v is not None}, [AnnotatorConfig], at)
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    for fld in ("name", "base_url", "model", "api_key_env"):
        if fld in kwargs and not kwargs[fld].strip():
            bad(fld, "must be a non-empty string")
    if not re.match(r"^https?://", kwargs["base_url"]):
        bad("base_url", f"must start with http:// or https://, got {kwargs['base_url']!r}")
    if "api_key_env" in kwargs and not _ENV_NAME.match(kwargs["api_key_env"]):
        # Never echo the value: it may be a pasted key.
        bad("api_key_env", "must be the NAME of an environment variable (letters, digits, _), not a key")
    kwargs["base_url"] = kwargs["base_url"].rstrip("/")
    try:
        register_secret(urlsplit(kwargs["base_url"]).password)  # https://user:PASS@host: errors name the URL
    except ValueError:
        bad("base_url", "is not a valid URL")
    return AnnotatorConfig(**kwargs)


def load_annotators(path: str | os.PathLike) -> list[AnnotatorConfig]:
    """Parse and validate an annotators file (top-level ``annotators:`` list)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: annotators file not found")
    try:
        doc, lines = load_yaml_located(path)  # strict: duplicate keys, not UTF-8, a directory -> one line
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(doc, dict) or "annotators" not in doc:
        raise ConfigError(f"{path}: expected a top-level 'annotators:' list")
    unknown = sorted(set(doc) - {"annotators"})
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key {unknown[0]!r} (only 'annotators' is allowed)")
    entries = doc["annotators"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: 'annotators' must be a non-empty list")
    out = [_check_entry(raw, path, lines, i) for i, raw in enumerate(entries)]

    seen_names: dict[str, int] = {}
    seen_requests: dict[tuple, int] = {}
    for i, a in enumerate(out):
        if a.name in seen_names:
            raise ConfigError(
                f"{path}:{lines.get(('annotators', i, 'name'), '?')}: annotators[{i}]: name: duplicate name "
                f"{a.name!r} (first at annotators[{seen_names[a.name]}])"
            )
        seen_names[a.name] = i
        # Identical model + decoding would send identical requests: the cache would
        # hand both the same answer and the "vote" would count one model twice.
        ident = (a.model, tuple(sorted(a.decoding().items())))
        if ident in seen_requests:
            raise ConfigError(
                f"{path}:{lines.get(('annotators', i, 'model'), '?')}: annotators[{i}] ({a.name!r}): model: same "
                f"model and decoding settings as annotators[{seen_requests[ident]}]; their votes would be copies"
            )
        seen_requests[ident] = i
    return out
