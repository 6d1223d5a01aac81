"""Annotator YAML: which models annotate, where they live, how hard to push them.

The file names the *environment variable* that holds each key, never the
key, so recipes can be committed and shared; a keyless local server (llama.cpp,
vLLM without ``--api-key``) needs no variable at all. The file is read with the
strict YAML loader (a key given twice is an error naming both lines). Errors
name the file, the entry index (and name when known) and the field.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from real_fae_core.errors import UserError
from real_fae_core.openai_client import NO_KEY
from real_fae_core.secrets import read_key, register_secret
from real_fae_core.yamlio import load_yaml

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """A bad annotators file or a missing key variable: one clear sentence."""


@dataclass(frozen=True)
class AnnotatorConfig:
    """One annotator LLM behind an OpenAI-compatible ``/v1/chat/completions``."""

    name: str
    base_url: str
    model: str
    max_concurrency: int
    temperature: float
    max_tokens: int
    api_key_env: str | None = None  # None: a keyless server (llama.cpp, vLLM without --api-key)
    timeout: float = 60.0  # seconds per HTTP request
    max_retries: int = 6  # transport retries (429, 5xx, timeouts, connection errors)
    malformed_retries: int = 2  # re-asks after an unparseable answer, then abstain
    backoff_base: float = 1.0  # seconds; delay ~ U(0, min(backoff_max, base * 2**attempt))
    backoff_max: float = 60.0
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


_REQUIRED = ("name", "base_url", "model", "max_concurrency", "temperature", "max_tokens")
_ALLOWED = {f.name for f in fields(AnnotatorConfig)}


def _check_entry(raw: Any, where: str) -> AnnotatorConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping with fields {', '.join(_REQUIRED)}")
    name = raw.get("name")
    if isinstance(name, str) and name:
        where = f"{where} ({name!r})"

    def bad(fld: str, reason: str):
        raise ConfigError(f"{where}: field {fld!r}: {reason}")

    unknown = sorted(set(raw) - _ALLOWED)
    if unknown:
        if "api_key" in unknown:
            bad("api_key", "keys never go into this file; name the environment variable in 'api_key_env'")
        bad(unknown[0], f"unknown field (allowed: {', '.join(sorted(_ALLOWED))})")
    for fld in _REQUIRED:
        if fld not in raw or raw[fld] is None:
            bad(fld, "missing required field")
    for fld in ("name", "base_url", "model", "api_key_env"):
        if fld == "api_key_env" and raw.get(fld) is None:
            continue  # optional: a keyless server
        if not isinstance(raw[fld], str) or not raw[fld].strip():
            bad(fld, "must be a non-empty string")
    if not re.match(r"^https?://", raw["base_url"]):
        bad("base_url", f"must start with http:// or https://, got {raw['base_url']!r}")
    if raw.get("api_key_env") is not None and not _ENV_NAME.match(raw["api_key_env"]):
        # Never echo the value: it may be a pasted key.
        bad("api_key_env", "must be the NAME of an environment variable (letters, digits, _), not a key")

    def integer(fld: str, lo: int) -> None:
        v = raw.get(fld)
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            bad(fld, f"must be an integer >= {lo}, got {v!r}")

    def number(fld: str, lo: float, strict: bool) -> None:
        v = raw.get(fld)
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (v <= lo if strict else v < lo):
            bad(fld, f"must be a number {'>' if strict else '>='} {lo}, got {v!r}")

    integer("max_concurrency", 1)
    integer("max_tokens", 1)
    integer("max_retries", 0)
    integer("malformed_retries", 0)
    number("temperature", 0.0, strict=False)
    number("timeout", 0.0, strict=True)
    number("backoff_base", 0.0, strict=False)
    number("backoff_max", 0.0, strict=False)
    if raw.get("seed") is not None and (isinstance(raw["seed"], bool) or not isinstance(raw["seed"], int)):
        bad("seed", f"must be an integer, got {raw['seed']!r}")
    if raw.get("constrained_decoding") is not None and not isinstance(raw["constrained_decoding"], bool):
        bad("constrained_decoding", f"must be true or false, got {raw['constrained_decoding']!r}")
    kwargs = {k: v for k, v in raw.items() if v is not None}
    for fld in ("temperature", "timeout", "backoff_base", "backoff_max"):
        if fld in kwargs:
            kwargs[fld] = float(kwargs[fld])
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
        doc = load_yaml(path)  # strict: duplicate keys, not UTF-8, a directory -> one line
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
    out = [_check_entry(raw, f"{path}: annotators[{i}]") for i, raw in enumerate(entries)]

    seen_names: dict[str, int] = {}
    seen_requests: dict[tuple, int] = {}
    for i, a in enumerate(out):
        if a.name in seen_names:
            raise ConfigError(
                f"{path}: annotators[{i}]: field 'name': duplicate name {a.name!r} "
                f"(first at annotators[{seen_names[a.name]}])"
            )
        seen_names[a.name] = i
        # Identical model + decoding would send identical requests: the cache would
        # hand both the same answer and the "vote" would count one model twice.
        ident = (a.model, tuple(sorted(a.decoding().items())))
        if ident in seen_requests:
            raise ConfigError(
                f"{path}: annotators[{i}] ({a.name!r}): field 'model': same model and decoding "
                f"settings as annotators[{seen_requests[ident]}]; their votes would be copies"
            )
        seen_requests[ident] = i
    return out
