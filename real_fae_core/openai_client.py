"""The one policy for calling OpenAI-compatible servers: client, retryable failures, backoff, counts.

Used by ``real-data enhance`` / ``counterfactual``, ``fae run --backend openai``
and ``fae pave`` (all async, through :meth:`RetryPolicy.acall`), so what is
retried and how long to wait is written once. The loop is
``tenacity.AsyncRetrying``; this module gives it the rules below (what is
retried, the waits, the stop) and the counting hooks.

Why not the openai client's own retries: :func:`open_client` sets
``max_retries=0`` so every HTTP attempt passes through here. The client's loop
is invisible (no counts for enhance's summary or fae's ``runs.jsonl``), does
not retry a 200 whose body is unusable (a truncated JSON, no message content),
and cannot let a caller change the request between attempts (a server that
refuses ``json_schema`` or ``logprobs`` is asked again without them).

The policy, per request:

- retried: connection errors, timeouts, HTTP 408, 409, 429 and 5xx, and
  unusable 200 bodies (:class:`BadResponse`, malformed JSON);
- anything else (400, 401, 403, 404, ...) is raised at once, unchanged;
- retry ``k`` (1-based) waits ``U(0, min(backoff_max, backoff_base * 2**(k-1)))``
  seconds (exponential backoff with full jitter), or the server's
  ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date) when it sends
  one; ``backoff_max`` caps every wait, the server's hint included;
- after ``max_retries`` retries :class:`RetriesExhausted` carries the last error.

Counting goes through :class:`CallHooks` (``attempt()`` before every request,
``failure(kind, retrying)`` after every failed one). Failure kinds are ``"timeout"``, ``"connection"``, ``"malformed"``
and ``"http_<status>"``.

Messages built here (:func:`describe_error`, :class:`RetriesExhausted`) go
through :func:`real_fae_core.secrets.scrub`: servers echo the Authorization
header in error bodies and the openai client puts those bodies in its messages.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import tenacity

from real_fae_core.errors import UserError
from real_fae_core.secrets import read_key, register_secret, scrub

T = TypeVar("T")

NO_KEY = "EMPTY"  # what a keyless server (vLLM, llama.cpp without --api-key) is sent
RETRY_STATUS = frozenset({408, 409, 429})  # plus every 5xx


class BadResponse(ValueError):
    """A 200 whose body holds no usable answer (e.g. no ``choices[0].message.content``); retried."""


def open_client(base_url: str | None, api_key: str, *, timeout: float, max_connections: int | None = None,
                aiohttp: bool = False):
    """An ``openai.AsyncOpenAI`` with the library's retries off: ours are the only ones.

    The key and any password in ``base_url`` are registered for :func:`scrub` first.
    ``max_connections``: keep that many connections alive (the client's default
    keeps 100, so a run with more requests in flight would reconnect all the time).
    ``aiohttp``: send through openai's aiohttp transport when aiohttp is installed.
    Measured (benchmarks/fleet_client.py) it costs half the client CPU per request of
    the default httpx pool, which scans every pooled connection on each request.
    """
    import openai

    if api_key != NO_KEY:
        register_secret(api_key)
    try:
        register_secret(urlsplit(base_url or "").password)
    except ValueError:  # an invalid URL: the client reports it on the first request
        pass
    http_client = None
    if max_connections or aiohttp:
        from openai import _base_client

        httpx = getattr(_base_client, "httpx2", None) or _base_client.httpx  # the HTTP library this openai uses
        cls = openai.DefaultAsyncHttpxClient
        if aiohttp and has_aiohttp():
            cls = openai.DefaultAioHttpClient
        n = max(int(max_connections or 100), 1)
        http_client = cls(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), timeout=timeout)
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0,
                              http_client=http_client)


def has_aiohttp() -> bool:
    """aiohttp (and the openai release's transport for it) can be imported."""
    import importlib.util

    if importlib.util.find_spec("aiohttp") is None:
        return False
    try:  # vendored by recent openai releases, a separate package (openai[aiohttp]) before
        import openai._vendor.httpx_aiohttp  # noqa: F401
    except ImportError:
        return importlib.util.find_spec("httpx_aiohttp") is not None
    return True


def key_from_env(env_var: str | None, named_by: str) -> str:
    """The key in ``env_var`` (registered as a secret); :data:`NO_KEY` when no variable is named.

    An unset variable is a :class:`UserError` naming the variable and the option
    that named it (``named_by``), never a value.
    """
    if not env_var:
        return NO_KEY
    key = read_key(env_var)
    if not key:
        raise UserError(f"environment variable {env_var} (named by {named_by}) is not set")
    return key


def failure_kind(exc: BaseException) -> str | None:
    """``timeout``, ``connection``, ``malformed`` or ``http_<status>``; None for anything not from the server."""
    import openai

    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}"
    if isinstance(exc, (BadResponse, json.JSONDecodeError, openai.APIResponseValidationError)):
        return "malformed"
    return None


def is_retryable(kind: str | None) -> bool:
    """Transient by kind: transport faults, unusable bodies, 408, 409, 429 and 5xx."""
    if kind is None:
        return False
    if not kind.startswith("http_"):
        return True
    code = int(kind[5:])
    return code in RETRY_STATUS or code >= 500


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms``, then ``Retry-After``), None when it did not."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return _finite(float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return _finite(float(value))
        except ValueError:
            when = parsedate_to_datetime(value)  # "Wed, 21 Oct 2015 07:28:00 GMT"
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _finite(x: float) -> float | None:
    return max(0.0, x) if math.isfinite(x) else None


def describe_error(exc: BaseException) -> str:
    """``Kind: message``, scrubbed, with the transport's own reason ("Connection refused") the client hides."""
    import openai

    text = scrub(exc) or type(exc).__name__
    if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError)):
        cause = exc.__cause__ or exc.__context__
        if cause is not None and str(cause):
            text = f"{text.rstrip('.')}. ({type(cause).__name__}: {scrub(cause)})"
    return f"{type(exc).__name__}: {text}"


class CallHooks(Protocol):
    """What the policy reports; implement both to keep your own counters."""

    def attempt(self) -> None:
        """A request is about to be sent (every try, re-asks included)."""

    def failure(self, kind: str, retrying: bool) -> None:
        """A request failed with ``kind``; ``retrying`` says whether it will be sent again."""


class RetriesExhausted(Exception):
    """A request still failing after ``max_retries`` retries; ``last`` is its final error."""

    def __init__(self, last: BaseException, kind: str, retries: int):
        self.last, self.kind, self.retries = last, kind, retries
        self.attempts = retries + 1
        super().__init__(f"gave up after {self.attempts} attempts: {describe_error(last)}")


@dataclass
class RetryPolicy:
    """How often and how long to retry one request; see the module docstring for the rules."""

    max_retries: int = 6
    backoff_base: float = 1.0  # seconds before the first retry (upper bound of its jitter), doubling
    backoff_max: float = 60.0  # cap on every wait, the server's Retry-After included
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def delay(self, retry: int, exc: BaseException | None = None) -> float:
        """Seconds before retry number ``retry`` (1-based) after ``exc``."""
        hinted = retry_after(exc) if exc is not None else None
        if hinted is not None:
            return min(self.backoff_max, hinted)
        return self.rng.uniform(0, min(self.backoff_max, self.backoff_base * 2 ** (retry - 1)))

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """tenacity's wait: :meth:`delay` before the retry that follows attempt ``state.attempt_number``.

        tenacity asks for the wait before it checks the stop; after the last
        allowed attempt no retry follows, so no jitter is drawn (the same seed
        gives the same waits whatever failed before).
        """
        if state.attempt_number > self.max_retries:
            return 0.0
        return self.delay(state.attempt_number, state.outcome.exception())

    async def acall(self, send: Callable[[], Awaitable[T]], *, hooks: CallHooks | None = None,
                    again: Callable[[Exception], bool] | None = None) -> T:
        """``await send()`` under this policy, retried by ``tenacity.AsyncRetrying``.

        ``again(exc)`` lets the caller adapt the request to a refusal (drop a
        ``response_format`` or ``logprobs`` the server rejects) and return True:
        it is then sent at once, not counted as a retry. It must return True
        only once per cause.
        """

        async def attempt() -> T:  # one attempt as tenacity counts them; the caller's re-asks belong to it
            while True:
                if hooks is not None:
                    hooks.attempt()
                try:
                    return await send()
                except Exception as exc:
                    if again is not None and again(exc):
                        continue
                    kind = failure_kind(exc)
                    if hooks is not None and kind is not None and not is_retryable(kind):
                        hooks.failure(kind, False)  # tenacity raises it unchanged
                    raise

        def retrying(state: tenacity.RetryCallState) -> None:  # before_sleep: a retry follows
            if hooks is not None:
                hooks.failure(failure_kind(state.outcome.exception()), True)

        def exhausted(state: tenacity.RetryCallState) -> T:  # retry_error_callback: the budget is spent
            exc = state.outcome.exception()
            kind = failure_kind(exc)
            if hooks is not None:
                hooks.failure(kind, False)
            raise RetriesExhausted(exc, kind, state.attempt_number - 1) from exc

        return await tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(lambda exc: is_retryable(failure_kind(exc))),
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            before_sleep=retrying,
            retry_error_callback=exhausted,
        )(attempt)


def options_policy(options: dict[str, Any], *, seed: int | None = None) -> RetryPolicy:
    """A policy from ``max_retries`` / ``backoff_base`` / ``backoff_max`` options (absent or None: the default)."""
    given = {k: options[k] for k in ("max_retries", "backoff_base", "backoff_max") if options.get(k) is not None}
    policy = RetryPolicy(rng=random.Random(seed))
    return RetryPolicy(int(given.get("max_retries", policy.max_retries)),
                       float(given.get("backoff_base", policy.backoff_base)),
                       float(given.get("backoff_max", policy.backoff_max)), policy.rng)
