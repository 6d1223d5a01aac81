"""OpenAI-compatible chat backend: GPT-4o-mini, Gemini (OpenAI endpoint), a vLLM server.

Requests run concurrently (``--concurrency``) under the project's one policy for
OpenAI-compatible servers (:mod:`real_fae_core.openai_client`): 408, 409, 429,
5xx, timeouts, connection errors and malformed bodies are retried with
exponential backoff and jitter (or the server's ``Retry-After``), and every
request and retry is counted in ``stats`` (written to ``runs.jsonl``; keys
``429``, ``5xx``, ``timeout``, ``connection``, ``malformed``, plus ``408`` /
``409`` when they occur). Other HTTP errors (401, 400, 404) are not retried.

Soft FAE: each request also asks for ``logprobs: true, top_logprobs: 5`` and
the answer carries the label probabilities read at the label position
(:func:`fae.backends.label_probs.label_probs_from_top_logprobs`); a response without
logprobs gives none (the reason goes to ``stats``, i.e. runs.jsonl). A server
that rejects the logprobs fields (HTTP 400) is asked again without them, and
not asked for them again in this run. ``label_probs: false`` turns the request off.

A request that still fails after ``--max-retries`` retries stops the run with
a :class:`BackendError`; no answer is invented. Claims of earlier chunks are
already on disk, so rerunning the same command resumes.

The API key is read from the environment variable named by ``--api-key-env``
(through :func:`real_fae_core.openai_client.key_from_env`) and is never stored: config.json
records only the variable's name. Servers echo the ``Authorization`` header in
error bodies, so every error text is passed through
:func:`real_fae_core.secrets.scrub` before it is raised, printed or written to
``runs.jsonl``.

With ``constrained_decoding`` each request carries the JSON schema of its
prompt as ``response_format={"type": "json_schema", ...}``
(:mod:`data_prep.schemas`). A server that rejects it (HTTP 400 naming
``response_format`` / ``json_schema``) is asked again with
``{"type": "json_object"}``, and that fallback is remembered for the rest of
the run (``stats["json_object_fallback"]``).

Per-prompt decoding (:meth:`OpenAIBackend.generate_rows`, the evaluation-choice study of SPEC §10):
each request carries its row's ``seed``, ``temperature``, ``top_p`` and ``max_tokens``, and ``top_k``
in the body beside them (vLLM and llama.cpp servers read it; the OpenAI API has no such field). A
server that refuses ``top_k`` with HTTP 400 is asked again without it, and not sent it again in this
run (``stats["top_k_skipped"]``); every answer records what its request sent (``Generation.decoding``).
Whether the samples follow the seed is the server's promise: vLLM draws a seeded request from its own
generator; the OpenAI API calls its ``seed`` best effort.

Fleets: every request of a claim carries the header named by
``--routing-header`` (default ``X-Session-ID``; empty: none) with the key
``<run>/<claim id>``, so a consistent-hash router (``vllm-router --policy
consistent_hash``) sends all rounds of a claim to one server, whose prefix
cache then serves round r from round r-1's KV (docs/scale.md). The key does
not change answers, so it is not part of the resume fingerprint.
:meth:`OpenAIBackend.streaming` gives :mod:`fae.ablation.streaming` one client
and one event loop for a whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from dataclasses import dataclass, field, replace
from typing import Any, Mapping
from urllib.parse import urlsplit

from real_fae_core.errors import UserError
from real_fae_core.openai_client import (
    BadResponse,
    RetriesExhausted,
    describe_error,
    failure_kind,
    is_retryable,
    key_from_env,
    open_client,
    options_policy,
)
from real_fae_core.secrets import register_secret, scrub
from data_prep.schemas import JSON_OBJECT_FORMAT, response_format, schema_for_prompt
from fae.backends import Backend, BackendError, BackendOptions, Generation, RowDecoding, register
from fae.backends.label_probs import label_probs_from_top_logprobs, openai_token_list


class MalformedResponse(BadResponse):
    """A 200 response without a usable ``choices[0].message.content`` (retried)."""


class _StatsHooks:
    """The policy's counts, written into the backend's ``stats`` under the keys runs.jsonl has always had."""

    def __init__(self, stats: dict[str, Any]):
        self.stats = stats

    def attempt(self) -> None:
        self.stats["requests"] += 1

    def failure(self, kind: str, retrying: bool) -> None:
        if not is_retryable(kind):
            return  # the run stops with its message
        if kind.startswith("http_"):
            kind = "5xx" if int(kind[5:]) >= 500 else kind[5:]
        self.stats[kind] = self.stats.get(kind, 0) + 1
        self.stats["retries"] += int(retrying)


OPENAI_GROUP = "openai backend"  # the section of `fae run --help` (and of a command that embeds them) of these options


@dataclass
class OpenAIOptions(BackendOptions):
    """``--backend openai``: an OpenAI-compatible endpoint (``model`` is the served model's name)."""

    base_url: str | None = field(default=None, metadata={
        "help": "openai: OpenAI-compatible endpoint, e.g. http://localhost:8000/v1", "group": OPENAI_GROUP})
    api_key_env: str | None = field(default=None, metadata={
        "help": "openai: environment variable holding the API key (the key itself is never stored)",
        "metavar": "VAR", "group": OPENAI_GROUP})
    concurrency: int = field(default=8, metadata={"help": "openai: requests in flight", "min": 1,
                                                  "group": OPENAI_GROUP})
    request_timeout: float = field(default=60.0, metadata={"help": "openai: seconds per request", "above": 0,
                                                           "group": OPENAI_GROUP})
    max_retries: int = field(default=6, metadata={"help": "openai: retries on 429/5xx/timeouts/bad bodies",
                                                  "min": 0, "group": OPENAI_GROUP})
    backoff_base: float = field(default=1.0, metadata={"help": "openai: first backoff in seconds (doubles)",
                                                       "min": 0, "group": OPENAI_GROUP})
    seed: int | None = field(default=None, metadata={"help": "openai: sampling seed sent to the endpoint",
                                                     "group": OPENAI_GROUP})
    routing_header: str = field(default="X-Session-ID", metadata={
        "help": "openai: HTTP header carrying a per-claim key (<run>/<claim id>; empty: not sent), so a "
                "consistent-hash router (vllm-router --policy consistent_hash) keeps all rounds of a claim on "
                "one server and its prefix cache serves round r from round r-1's KV", "metavar": "NAME",
        "group": OPENAI_GROUP})


@register("openai")
class OpenAIBackend(Backend):
    """``--backend openai``: any endpoint speaking ``/v1/chat/completions``."""

    options_class = OpenAIOptions

    def __init__(self, options: OpenAIOptions | Mapping[str, Any]):
        super().__init__(options)
        o = self.options
        try:
            import openai  # noqa: F401
        except ImportError:  # pragma: no cover - a core dependency
            raise UserError("the openai backend needs the 'openai' package: pip install openai")
        self.model = o.model
        self.base_url = o.base_url
        try:  # https://user:PASS@host: errors name the URL, never the password
            register_secret(urlsplit(self.base_url or "").password)
        except ValueError:
            raise UserError("--base-url is not a valid URL (check the host part)") from None
        # no --api-key-env: local servers (vLLM) that do not check keys get NO_KEY
        self._api_key = key_from_env(o.api_key_env, "--api-key-env")
        self.concurrency, self.timeout = o.concurrency, o.request_timeout
        self.policy = options_policy(vars(o), seed=0)  # --max-retries, --backoff-base
        self.max_retries = self.policy.max_retries
        self.max_new_tokens, self.seed = o.max_new_tokens, o.seed
        # a subclass with its own parse_response (fae pave) handles logprobs itself
        self.label_probs = o.label_probs and type(self).parse_response is OpenAIBackend.parse_response
        self.stats = {"requests": 0, "retries": 0, "429": 0, "5xx": 0, "timeout": 0,
                      "connection": 0, "malformed": 0}
        self.logprobs_rejected = False  # the endpoint refused logprobs once: never asked again
        self.routing_header = (o.routing_header or "").strip()
        self.constrained = o.constrained_decoding
        self.schema_rejected = False  # the endpoint refused json_schema once: json_object from then on
        self.top_k_rejected = False  # the endpoint refused top_k once (generate_rows): never sent again
        if self.constrained:
            self.stats["json_object_fallback"] = 0

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r})"

    @classmethod
    def decoding_of(cls, options: OpenAIOptions):
        """Greedy at temperature 0 with the cap (and the seed, when given): what a resume must match."""
        out = {"greedy": True, "temperature": 0.0, "max_new_tokens": options.max_new_tokens}
        if options.seed is not None:
            out["seed"] = options.seed
        return out

    @classmethod
    def default_chunk_size(cls, options: OpenAIOptions) -> int:
        """As many claims in flight as requests may be (``concurrency``), so the server is kept busy."""
        return options.concurrency

    def generate(self, prompts, callback=None):
        """One answer per prompt, in order, at most ``concurrency`` requests at a time (retried as the policy says);
        a request that keeps failing is a :class:`BackendError`."""
        return asyncio.run(self._generate_all(prompts, callback))

    def generate_rows(self, prompts, decodings, callback=None):
        """One answer per prompt, each request carrying its row's decoding (see :meth:`decoding_kwargs`).

        Each answer's ``decoding`` is what its request finally sent. No logprobs are asked (they read the
        JSON answer's label) and no response_format (its schema is the JSON answer's).
        """
        if len(prompts) != len(decodings):
            raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        if self.constrained:
            raise UserError("per-prompt decoding does not combine with constrained decoding "
                            "(its schema is the JSON answer of SPEC §3)")
        return asyncio.run(self._generate_all(prompts, callback, decodings))

    async def _generate_all(self, prompts, callback, decodings=None):
        client = open_client(self.base_url, self._api_key, timeout=self.timeout)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(messages, decoding):
            text = await self._request(client, sem, messages, decoding=decoding)
            if callback:
                callback(1)
            return text

        try:
            tasks = [asyncio.ensure_future(one(m, d))
                     for m, d in zip(prompts, decodings if decodings is not None else [None] * len(prompts))]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        finally:
            await client.close()

    @contextlib.asynccontextmanager
    async def streaming(self):
        """An ``answer(messages, routing_key, priority=0)`` coroutine function on one client for the whole run.

        Used inside one event loop (:mod:`fae.ablation.streaming`): no client or
        connection pool per step, at most ``concurrency`` requests in flight, and
        a free slot goes to the waiting request of highest ``priority`` (the
        claim's round), so started claims finish before new ones start: their
        next round reaches the server while its prefix cache still holds the
        last one, and a killed run loses few half-done claims.
        """
        client = open_client(self.base_url, self._api_key, timeout=self.timeout,
                             max_connections=self.concurrency, aiohttp=True)
        gate = PriorityGate(self.concurrency)

        async def answer(messages, routing_key: str | None = None, priority: int = 0):
            return await self._request(client, gate.slot(priority), messages, routing_key, plain_body=True)

        try:
            yield answer
        finally:
            await client.close()

    def request_kwargs(self, messages) -> dict[str, Any]:
        """Arguments of one ``chat.completions.create`` call (a hook: ``fae pave`` adds ``n``, logprobs)."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages,
                                  "temperature": 0.0, "max_tokens": self.max_new_tokens}
        if self.seed is not None:
            kwargs["seed"] = int(self.seed)
        if self.constrained:
            kwargs["response_format"] = self.response_format_for(messages)
        return kwargs

    def decoding_kwargs(self, decoding: RowDecoding) -> dict[str, Any]:
        """The request fields of one row's decoding: greedy is temperature 0; a sampled row sends its
        ``seed``, ``temperature`` and ``top_p``, and ``top_k`` in the body beside them (``extra_body``: not
        an OpenAI API field, but vLLM and llama.cpp servers read it) until the server refuses it once."""
        cap = decoding.max_new_tokens or self.max_new_tokens
        if decoding.greedy:
            return {"temperature": 0.0, "max_tokens": cap}
        out: dict[str, Any] = {"temperature": decoding.temperature, "top_p": decoding.top_p,
                               "seed": decoding.seed, "max_tokens": cap}
        if decoding.top_k and not self.top_k_rejected:
            out["extra_body"] = {"top_k": decoding.top_k}
        return out

    def response_format_for(self, messages) -> dict[str, Any]:
        """The prompt's JSON schema, or ``json_object`` once the endpoint has rejected schemas."""
        if self.schema_rejected:
            return dict(JSON_OBJECT_FORMAT)
        return response_format(schema_for_prompt(messages), name="fae_answer")

    def parse_response(self, resp) -> Any:
        """The answer in a response; :class:`MalformedResponse` (retried) when it has none. A hook.

        ``finish_reason == "length"`` means ``max_tokens`` cut the answer off.
        """
        choices = getattr(resp, "choices", None)
        if not choices or choices[0].message is None or not isinstance(choices[0].message.content, str):
            raise MalformedResponse("response has no choices[0].message.content")
        return Generation(choices[0].message.content, getattr(choices[0], "finish_reason", None))

    def count_cached(self, resp) -> None:
        """Add the prompt tokens the server's prefix cache served (``usage.prompt_tokens_details``) to ``stats``.

        Only servers that report it (vLLM with ``--enable-prompt-tokens-details``, the OpenAI API)
        add ``prompt_tokens`` / ``cached_prompt_tokens``: their ratio in runs.jsonl shows whether a
        fleet's router keeps each claim on one server (docs/scale.md).
        """
        usage = getattr(resp, "usage", None)
        cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
        if isinstance(cached, int) and isinstance(getattr(usage, "prompt_tokens", None), int):
            self.stats["prompt_tokens"] = self.stats.get("prompt_tokens", 0) + usage.prompt_tokens
            self.stats["cached_prompt_tokens"] = self.stats.get("cached_prompt_tokens", 0) + cached

    def with_label_probs(self, answer: Any, resp) -> Any:
        """The answer with the label probabilities read from the response's logprobs (soft FAE).

        A server that gives no logprobs at all is noted once in ``stats``
        (``no_logprobs`` count, ``label_probs_skipped`` reason; both go to
        runs.jsonl) rather than on every round; a reason specific to one
        answer (no label in it, no label among the alternatives) goes on its round.
        """
        if not self.label_probs or not isinstance(answer, Generation):
            return answer
        tokens = openai_token_list(getattr(resp.choices[0], "logprobs", None))
        if tokens is None:
            self.stats["no_logprobs"] = self.stats.get("no_logprobs", 0) + 1
            self.stats["label_probs_skipped"] = "the server returned no logprobs"
            return answer
        probs, logprobs, why = label_probs_from_top_logprobs(tokens)
        return replace(answer, label_probs=probs, label_logprobs=logprobs, label_probs_skipped=why)

    async def _request(self, client, sem, messages, routing_key: str | None = None,
                       plain_body: bool = False, decoding: RowDecoding | None = None) -> Any:
        """One answer under the retry policy.

        ``plain_body``: post the arguments as the JSON body (``client.post``) instead of through
        ``chat.completions.create``, whose per-request walk of the message types costs more than
        a quarter of the client's CPU at hundreds of requests per second (benchmarks/fleet_client.py).
        ``decoding``: this request's own decoding (:meth:`generate_rows`).
        """
        kwargs = self.request_kwargs(messages)
        if decoding is not None:
            kwargs.update(self.decoding_kwargs(decoding))
        elif self.label_probs:
            kwargs.update(logprobs=True, top_logprobs=5)
        if routing_key and self.routing_header:
            kwargs["extra_headers"] = {self.routing_header: routing_key}

        async def send():
            async with sem:
                # refusals learnt from other requests while this one waited for its slot
                if self.logprobs_rejected:
                    kwargs.pop("logprobs", None)
                    kwargs.pop("top_logprobs", None)
                if self.schema_rejected and (kwargs.get("response_format") or {}).get("type") == "json_schema":
                    kwargs["response_format"] = self.response_format_for(messages)
                if self.top_k_rejected:
                    drop_top_k(kwargs)
                if plain_body:
                    from openai.types.chat import ChatCompletion

                    body = {k: v for k, v in kwargs.items() if k not in ("extra_headers", "extra_body")}
                    body.update(kwargs.get("extra_body") or {})
                    options = {"headers": kwargs["extra_headers"]} if "extra_headers" in kwargs else {}
                    resp = await client.post("/chat/completions", body=body, cast_to=ChatCompletion,
                                             options=options)
                else:
                    resp = await client.chat.completions.create(**kwargs)
            if decoding is not None:
                answer = replace(self.parse_response(resp), decoding=sent_decoding(kwargs))
            else:
                answer = self.with_label_probs(self.parse_response(resp), resp)
            self.count_cached(resp)
            return answer

        def again(exc) -> bool:
            """Adapt the request to a refusal and ask at once (not a retry)."""
            if rejects_json_schema(exc, kwargs):
                if not self.schema_rejected:
                    self.schema_rejected = True
                    self.stats["json_object_fallback"] += 1
                kwargs["response_format"] = self.response_format_for(messages)
                return True
            if "logprobs" in kwargs and failure_kind(exc) == "http_400":
                # a server without logprobs support: ask again without them, for the whole run
                self.label_probs = False
                self.logprobs_rejected = True
                self.stats["label_probs_skipped"] = scrub(f"the server rejected logprobs: {_describe(exc)}")
                kwargs.pop("logprobs", None)
                kwargs.pop("top_logprobs", None)
                return True
            if "top_k" in (kwargs.get("extra_body") or {}) and failure_kind(exc) == "http_400":
                # top_k is no OpenAI API field: a server that refuses it samples without it, for the whole run
                self.top_k_rejected = True
                self.stats["top_k_skipped"] = scrub(f"the server rejected top_k: {_describe(exc)}")
                drop_top_k(kwargs)
                return True
            return False

        where = f"{self.base_url or 'OpenAI API'}: request for model {self.model!r}"
        try:
            return await self.policy.acall(send, hooks=_StatsHooks(self.stats), again=again)
        except RetriesExhausted as exc:
            raise BackendError(scrub(f"{where} still failing after {exc.retries} retries: "
                                     f"{_describe(exc.last)}")) from None
        except Exception as exc:  # noqa: BLE001 - not retryable: one clear line, no traceback
            raise BackendError(scrub(f"{where} failed: {_describe(exc)}")) from None


class PriorityGate:
    """At most ``n`` holders; a freed place goes to the waiter of highest priority (then first come).

    A place is handed on at the event loop's next turn, not at once: the holder
    that just released it (a claim whose answer came back) can first queue its
    next round, which then wins over claims not yet started.
    """

    def __init__(self, n: int):
        self.free = n
        self.waiters: list = []  # heap of (-priority, arrival, future)
        self.arrivals = 0
        self.waking = False

    def slot(self, priority: int = 0) -> "_Slot":
        """``async with gate.slot(priority):`` holds one place for the block (a higher priority is served first)."""
        return _Slot(self, priority)

    async def acquire(self, priority: int) -> None:
        """Wait for a place; a cancelled waiter gives up its turn (or, granted as it was cancelled, passes it on)."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.arrivals += 1
        heapq.heappush(self.waiters, (-priority, self.arrivals, fut))
        self._schedule()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted as it was cancelled: pass the place on
            else:
                fut.cancel()  # skipped when places are handed out
            raise

    def release(self) -> None:
        """Give the place back; it goes to the best waiter at the event loop's next turn."""
        self.free += 1
        self._schedule()

    def _schedule(self) -> None:
        if self.waiters and self.free > 0 and not self.waking:
            self.waking = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self.waking = False
        while self.free > 0 and self.waiters:
            _, _, fut = heapq.heappop(self.waiters)
            if not fut.done():
                self.free -= 1
                fut.set_result(None)


class _Slot:
    """``async with gate.slot(priority):`` one place in a :class:`PriorityGate` (each entry waits anew)."""

    def __init__(self, gate: PriorityGate, priority: int):
        self.gate, self.priority = gate, priority

    async def __aenter__(self) -> None:
        await self.gate.acquire(self.priority)

    async def __aexit__(self, *exc) -> None:
        self.gate.release()


def drop_top_k(kwargs: dict[str, Any]) -> None:
    """Remove ``top_k`` from a request's ``extra_body`` (and the body when nothing else is in it)."""
    extra = kwargs.get("extra_body")
    if extra and "top_k" in extra:
        rest = {k: v for k, v in extra.items() if k != "top_k"}
        if rest:
            kwargs["extra_body"] = rest
        else:
            del kwargs["extra_body"]


def sent_decoding(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The decoding fields a request sent (its record: what a server was asked, top_k only where sent)."""
    sent = {k: kwargs[k] for k in ("seed", "temperature", "top_p", "max_tokens") if k in kwargs}
    if "top_k" in (kwargs.get("extra_body") or {}):
        sent["top_k"] = kwargs["extra_body"]["top_k"]
    return sent


def rejects_json_schema(exc: BaseException, kwargs: dict[str, Any]) -> bool:
    """A 400 that refuses a ``json_schema`` response_format (the server only knows ``json_object``)."""
    fmt = kwargs.get("response_format") or {}
    if fmt.get("type") != "json_schema" or getattr(exc, "status_code", None) != 400:
        return False
    text = str(exc).lower()
    return "response_format" in text or "json_schema" in text


def _describe(exc: BaseException | None) -> str:
    """One scrubbed line: the status and the start of the message (bodies may echo the key)."""
    if exc is None:
        return "unknown error"
    status = getattr(exc, "status_code", None)
    if status:
        text = scrub(exc)  # before cutting: a cut could split the key and defeat the mask
        return f"HTTP {status}: {text.splitlines()[0][:200] if text else type(exc).__name__}"
    return describe_error(exc).splitlines()[0][:300]
