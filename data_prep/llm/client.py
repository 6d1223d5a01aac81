"""Async requests to one annotator: bounded concurrency, retries with backoff + jitter.

One client per annotator under the project's one policy for OpenAI-compatible
servers (:mod:`real_fae_core.openai_client`; the library's own retries are
off, so every HTTP request is counted here). The annotator YAML's
``max_retries``, ``backoff_base`` and ``backoff_max`` are that policy's:

- transport faults (429, 408, 409, 5xx, timeouts, connection errors, a
  truncated response body) are retried up to ``max_retries`` times per request
  after ``U(0, min(backoff_max, backoff_base * 2**k))`` seconds (full jitter),
  or the server's ``Retry-After`` (capped by ``backoff_max``) when it sends
  one; then the claim *fails* (not cached, retried by the next run);
- a malformed answer is re-asked up to ``malformed_retries`` times, then
  the annotator *abstains* for that claim (cached);
- 401/403/404 stop the annotator: every later claim fails without a request;
- with ``constrained_decoding`` every request carries the annotator schema
  (``{"evidence": [ids of the pool]}``, :mod:`data_prep.schemas`) as a
  ``json_schema`` response_format; a 400 that rejects it switches this
  annotator to ``{"type": "json_object"}`` for the rest of the run (asked
  again at once, not counted as a retry).

Error texts name the endpoint (base URL and model, never the key) and go
through :func:`real_fae_core.secrets.scrub` before they are stored or printed:
servers echo the ``Authorization`` header in error bodies, and the openai
client puts those bodies in its exception messages.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from real_fae_core.hashing import derived_seed
from real_fae_core.openai_client import (
    RetriesExhausted,
    RetryPolicy,
    open_client,
)
from real_fae_core.secrets import scrub
from data_prep.schemas import JSON_OBJECT_FORMAT, annotator_schema, response_format

from .cache import ABSTAIN, OK, CachedAnswer
from .config import AnnotatorConfig

_FATAL_STATUS = {401, 403, 404}
# the summary's names for the policy's failure kinds (http_<status>, timeout, connection: as they are)
_SUMMARY_KIND = {"malformed": "bad_response"}


class TransportFailure(Exception):
    """All retries spent (or a non-retryable HTTP error): the claim has no answer from this annotator."""


@dataclass
class AnnotatorStats:
    """Counters for the summary; mutated only from the event loop thread."""

    requests: int = 0  # HTTP requests sent (every attempt)
    from_cache: int = 0
    answered: int = 0  # claims with a parseable answer obtained this run
    abstained: int = 0  # claims recorded as abstention this run
    failed: int = 0  # claims without an answer (transport), not cached
    transport_retries: int = 0
    malformed_answers: int = 0
    json_object_fallback: int = 0  # 1 when the server refused json_schema response formats
    invented_ids: int = 0  # ids outside the pool, dropped (counted over all claims incl. cached)
    tokens_in: int = 0  # API usage of requests sent this run
    tokens_out: int = 0
    tokens_in_all: int = 0  # ... plus the usage stored with cached answers
    tokens_out_all: int = 0
    errors: dict = field(default_factory=dict)  # error kind -> count

    def note_error(self, kind: str) -> None:
        """Count one error of ``kind`` for the summary."""
        self.errors[kind] = self.errors.get(kind, 0) + 1


class AnnotatorClient:
    """One annotator's requests; also the policy's :class:`~real_fae_core.openai_client.CallHooks`."""

    def __init__(
        self,
        cfg: AnnotatorConfig,
        api_key: str,
        *,
        global_limit: asyncio.Semaphore | None = None,
        rng: random.Random | None = None,
    ):
        self.cfg = cfg
        self.stats = AnnotatorStats()
        self._client = open_client(cfg.base_url, api_key, timeout=cfg.timeout)  # registers the key for scrub()
        self._limit = asyncio.Semaphore(cfg.max_concurrency)
        self._global = global_limit
        self.policy = RetryPolicy(cfg.max_retries, cfg.backoff_base, cfg.backoff_max, rng or random.Random())
        self.dead: str | None = None  # set on 401/403/404: reason every later claim fails with
        self.schema_rejected = False  # the server refused json_schema: json_object from then on

    async def close(self) -> None:
        """Close the HTTP client (its connections); await it before the event loop ends."""
        await self._client.close()

    def attempt(self) -> None:
        """Hook: requests are counted where they are sent (:meth:`_send_now`), after the slot wait."""

    def failure(self, kind: str, retrying: bool) -> None:
        """Hook: every failed request by kind; the retries among them."""
        self.stats.note_error(_SUMMARY_KIND.get(kind, kind))
        self.stats.transport_retries += int(retrying)

    async def _send(self, messages: list[dict[str, str]], pool_ids=(), reask: int = 0) -> tuple[str | None, int, int]:
        async with self._limit:
            if self._global is not None:
                async with self._global:
                    return await self._send_now(messages, pool_ids, reask)
            return await self._send_now(messages, pool_ids, reask)

    def request_options(self, pool_ids, reask: int = 0) -> dict:
        """Decoding settings as ``create`` kwargs: ``constrained_decoding`` becomes a response_format.

        At temperature > 0 every request carries a seed, so its answer is a
        function of (seed, model, messages) wherever the server honours seeds:
        the annotator's ``seed`` (0 when unset) for the first ask, and one
        derived from it and the re-ask number after a malformed answer (the
        same seed would only sample the same malformed answer again).
        """
        kwargs = self.cfg.decoding()
        if self.cfg.temperature > 0:
            base = kwargs.get("seed", 0)
            kwargs["seed"] = base if reask == 0 else derived_seed(base, "re-ask", reask)
        if kwargs.pop("constrained_decoding", False):
            kwargs["response_format"] = (dict(JSON_OBJECT_FORMAT) if self.schema_rejected
                                         else response_format(annotator_schema(pool_ids), name="evidence"))
        return kwargs

    async def _send_now(self, messages, pool_ids=(), reask: int = 0):
        if self.dead:  # stopped while this request waited for a slot
            raise TransportFailure(self.dead)
        self.stats.requests += 1
        resp = await self._client.chat.completions.create(
            model=self.cfg.model, messages=messages, **self.request_options(pool_ids, reask)
        )
        content = resp.choices[0].message.content if resp.choices else None
        usage = resp.usage
        pt = int(usage.prompt_tokens or 0) if usage else 0
        ct = int(usage.completion_tokens or 0) if usage else 0
        self.stats.tokens_in += pt
        self.stats.tokens_out += ct
        return content, pt, ct

    def rejects_json_schema(self, exc: Exception) -> bool:
        """Whether ``exc`` (an ``openai.APIStatusError``) is a 400 refusing the json_schema response_format (a
        server that knows only json_object)."""
        if not self.cfg.constrained_decoding or exc.status_code != 400:
            return False
        text = str(exc).lower()
        return "response_format" in text or "json_schema" in text

    async def annotate(self, messages: list[dict[str, str]], pool_ids: list[int],
                       check: Callable[[str | None], str | None]) -> CachedAnswer:
        """An ``ok`` answer or an ``abstain`` after malformed re-asks; raises TransportFailure.

        ``check(content)`` returns None for a usable answer or the reason it is
        not: the task's own parser (an evidence annotation over ``pool_ids``:
        :func:`data_prep.enhance.prompt.annotation_check`; a rewrite or a verdict
        in ``real-data counterfactual``), so every LLM task shares these retries.
        ``pool_ids``: the ids a constrained-decoding schema allows (empty: none).
        """
        import openai  # ~1 s: only once a request is sent, not when a command's parser is built

        malformed = 0
        pt_sum = ct_sum = 0
        fell_back = False

        def again(exc: Exception) -> bool:  # a server that knows only json_object: once per claim, no loop
            nonlocal fell_back
            if fell_back or not isinstance(exc, openai.APIStatusError) or not self.rejects_json_schema(exc):
                return False
            fell_back = self.schema_rejected = True
            self.stats.json_object_fallback = 1
            return True

        while True:
            if self.dead:
                raise TransportFailure(self.dead)
            try:
                content, pt, ct = await self.policy.acall(lambda: self._send(messages, pool_ids, malformed),
                                                          hooks=self, again=again)
            except RetriesExhausted as exc:
                raise TransportFailure(scrub(f"{self.cfg.endpoint}: {exc}")) from None
            except openai.APIStatusError as exc:  # not retryable
                code = exc.status_code
                if code in _FATAL_STATUS:
                    hint = f"{self.cfg.api_key_env}, base_url and model" if self.cfg.api_key_env \
                        else "base_url and model (no api_key_env is set: does the server want a key?)"
                    self.dead = scrub(
                        f"HTTP {code} from {self.cfg.endpoint}: {exc.message} (check {hint})"
                    )
                    raise TransportFailure(self.dead) from None
                raise TransportFailure(scrub(f"HTTP {code} from {self.cfg.endpoint}: {exc.message}")) from None
            pt_sum += pt
            ct_sum += ct
            error = check(content)
            if error is None:
                return CachedAnswer(OK, content, pt_sum, ct_sum)
            self.stats.malformed_answers += 1
            malformed += 1
            if malformed > self.cfg.malformed_retries:
                return CachedAnswer(ABSTAIN, content, pt_sum, ct_sum, error=error)
