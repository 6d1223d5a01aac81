"""The one retry policy (real_fae_core.openai_client) against a real HTTP server on 127.0.0.1.

No mock of the openai client: every error here is what the client raised for a
real response (429 with Retry-After, 408, 409, 400, 503, a refused connection).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
from dataclasses import dataclass, field

import openai
import pytest
from openai_server import LocalOpenAIServer, overlap_annotator

from real_fae_core.errors import UserError
from real_fae_core.openai_client import (
    NO_KEY,
    RetriesExhausted,
    RetryPolicy,
    failure_kind,
    is_retryable,
    key_from_env,
    open_client,
    options_policy,
)

KEY = "sk-policy-TEST-93ab-do-not-leak"
MSGS = [{"role": "user", "content": "Claim: the red fox jumps\nDocument:\nline0: a red fox jumps high"}]
FAST = {"backoff_base": 0.01, "backoff_max": 5.0}


def first_then_ok(*faults):
    """The first attempts get ``faults`` in order, then answers."""
    return lambda body, attempt: faults[attempt] if attempt < len(faults) else None


@dataclass
class CallCounts:
    """The :class:`CallHooks` a caller writes (as enhance's client and the openai backend do)."""

    attempts: int = 0
    retries: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def attempt(self) -> None:
        self.attempts += 1

    def failure(self, kind: str, retrying: bool) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self.retries += int(retrying)


def ask_async(srv, policy, counts=None, again=None):
    async def go():
        client = open_client(srv.base_url, KEY, timeout=5)
        try:
            return await policy.acall(lambda: client.chat.completions.create(model="m", messages=MSGS),
                                      hooks=counts, again=again)
        finally:
            await client.close()
    return asyncio.run(go())


def gaps(srv) -> list[float]:
    at = [r.at for r in srv.log]
    return [b - a for a, b in itertools.pairwise(at)]


def test_retryable_kinds():
    assert all(is_retryable(k) for k in ("timeout", "connection", "malformed", "http_408", "http_409",
                                         "http_429", "http_500", "http_503"))
    assert not any(is_retryable(k) for k in ("http_400", "http_401", "http_403", "http_404", "http_422", None))
    assert failure_kind(ValueError("a bug of the caller")) is None  # never retried, never counted


def test_backoff_is_exponential_with_full_jitter_and_capped():
    policy = RetryPolicy(max_retries=9, backoff_base=1.0, backoff_max=6.0, rng=random.Random(1))
    for retry, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0), (9, 6.0)]:
        waits = [policy.delay(retry) for _ in range(300)]
        assert 0 <= min(waits) and max(waits) <= cap
        assert max(waits) > 0.8 * cap  # the whole range is used, not a fixed wait


def test_429_with_retry_after_waits_the_hint_and_counts_once():
    counts = CallCounts()
    with LocalOpenAIServer(responder=overlap_annotator, faults=first_then_ok("429"),
                           error_headers={"Retry-After": "1"}) as srv:
        r = ask_async(srv, RetryPolicy(max_retries=3, **FAST), counts)
        assert [x.outcome for x in srv.log] == ["429", "ok"]
        assert gaps(srv)[0] >= 1.0  # the hint, not the 0.01 s backoff
    assert json.loads(r.choices[0].message.content) == {"evidence": [0]}
    assert (counts.attempts, counts.retries, counts.failures) == (2, 1, {"http_429": 1})


def test_retry_after_ms_is_honoured_and_every_hint_is_capped():
    with LocalOpenAIServer(faults=first_then_ok("503"), error_headers={"retry-after-ms": "400"}) as srv:
        ask_async(srv, RetryPolicy(max_retries=1, **FAST))
        assert gaps(srv)[0] >= 0.4
    with LocalOpenAIServer(faults=first_then_ok("429"), error_headers={"Retry-After": "3600"}) as srv:
        ask_async(srv, RetryPolicy(max_retries=1, backoff_base=0.01, backoff_max=0.2))
        assert gaps(srv)[0] < 2  # an hour asked, backoff_max (0.2 s) waited


def test_408_and_409_are_retried_400_is_not():
    counts = CallCounts()
    with LocalOpenAIServer(faults=first_then_ok("408", "409", "500")) as srv:
        ask_async(srv, RetryPolicy(max_retries=3, **FAST), counts)
        assert [x.outcome for x in srv.log] == ["408", "409", "500", "ok"]
    assert counts.retries == 3 and counts.failures == {"http_408": 1, "http_409": 1, "http_500": 1}
    counts = CallCounts()
    with LocalOpenAIServer(faults=first_then_ok("400")) as srv:
        with pytest.raises(openai.BadRequestError):  # raised as it is: the caller words it
            ask_async(srv, RetryPolicy(max_retries=3, **FAST), counts)
        assert srv.count() == 1
    assert (counts.attempts, counts.retries, counts.failures) == (1, 0, {"http_400": 1})


def test_exhausted_retries_name_attempts_and_error_never_the_key():
    counts = CallCounts()
    with LocalOpenAIServer(faults=lambda b, a: "503", echo_auth=True) as srv:
        with pytest.raises(RetriesExhausted) as info:
            ask_async(srv, RetryPolicy(max_retries=2, **FAST), counts)
        assert srv.count(outcome="503") == 3
    exc = info.value
    assert (exc.attempts, exc.retries, exc.kind) == (3, 2, "http_503")
    assert str(exc).startswith("gave up after 3 attempts: InternalServerError: Error code: 503")
    assert KEY in str(exc.last) and KEY not in str(exc)  # the server echoed it; the message masks it
    assert (counts.attempts, counts.retries, counts.failures) == (3, 2, {"http_503": 3})


def test_connection_refused_is_retried_then_names_the_reason():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    class Down:
        base_url = f"http://127.0.0.1:{port}/v1"

    counts = CallCounts()
    with pytest.raises(RetriesExhausted) as info:
        ask_async(Down, RetryPolicy(max_retries=1, **FAST), counts)
    assert counts.failures == {"connection": 2} and counts.retries == 1
    assert "APIConnectionError: Connection error. (ConnectError" in str(info.value)


def test_again_resends_at_once_without_counting_a_retry():
    seen = []

    def again(exc):  # the caller adapts its request once (as for a refused response_format)
        seen.append(failure_kind(exc))
        return len(seen) == 1

    counts = CallCounts()
    with LocalOpenAIServer(faults=first_then_ok("400")) as srv:
        ask_async(srv, RetryPolicy(max_retries=0), counts, again=again)
        assert [x.outcome for x in srv.log] == ["400", "ok"]
    assert seen == ["http_400"] and counts.attempts == 2 and counts.retries == 0 and counts.failures == {}


def test_client_has_no_retries_of_its_own_and_keys_come_from_the_env(monkeypatch):
    assert open_client("http://127.0.0.1:9/v1", NO_KEY, timeout=1).max_retries == 0
    assert key_from_env(None, "--api-key-env") == NO_KEY
    monkeypatch.delenv("POLICY_TEST_KEY", raising=False)
    with pytest.raises(UserError, match=r"environment variable POLICY_TEST_KEY \(named by --api-key-env\)"):
        key_from_env("POLICY_TEST_KEY", "--api-key-env")
    monkeypatch.setenv("POLICY_TEST_KEY", KEY)
    assert key_from_env("POLICY_TEST_KEY", "--api-key-env") == KEY
    p = options_policy({"max_retries": 0, "backoff_base": None})
    assert (p.max_retries, p.backoff_base, p.backoff_max) == (0, 1.0, 60.0)
