"""A real OpenAI-compatible chat-completions server on 127.0.0.1, for tests and benchmarks.

It speaks HTTP and the ``/v1/chat/completions`` JSON shape the ``openai``
client expects, plays one or more models through a ``responder`` function, and
injects faults deterministically: the fault plan sees the request body and how
many times that same body was seen before (its attempt number), so a test can
say "the first attempt of every third prompt gets a 429" regardless of the
order in which concurrent requests arrive.

Use in-process (``with LocalOpenAIServer(...) as srv: srv.base_url``) or as a
separate process (``python tests/openai_server.py --port 0 --latency 0.05``
prints ``READY <base_url>`` on stdout), the latter for benchmarks where the
client must not share the server's interpreter.

``--fast`` serves instant answers from one asyncio loop with HTTP/1.1
keep-alive and no faults, and reports the prompt words an earlier round of the
same claim on this server covered as cached tokens (:func:`serve_fast`): the threaded server spends more
CPU per request than the client under test, so it cannot measure a client at
hundreds of calls per second. Both answer ``GET /health`` and ``/v1/models`` (a
router's health checks), log the routing header (``X-Session-ID``) with each
request, and name themselves in an ``X-Served-By`` response header when given ``--name``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

# A fault is one of these strings (or None for a normal answer).
# "bad_content" is a well-formed API response whose message content is not the
# JSON answer asked for (a model's malformed answer, as opposed to a broken body).
FAULTS = ("400", "401", "408", "409", "429", "500", "503", "timeout", "malformed_body", "disconnect", "bad_content")
ERROR_STATUSES = {"400": 400, "401": 401, "408": 408, "409": 409, "429": 429, "500": 500, "503": 503}
BAD_CONTENT = "Sure! The relevant evidence is in the first lines."

SESSION_HEADER = "X-Session-ID"  # the routing header fae sends by default

Responder = Callable[[dict], str]
FaultPlan = Callable[[dict, int], "str | None"]

_LINE = re.compile(r"^line(\d+): (.*)$", re.MULTILINE)
_WORD = re.compile(r"[a-z0-9]+")


def body_key(body: dict) -> str:
    """Identity of a request: model + messages + decoding settings."""
    keep = {k: body.get(k) for k in ("model", "messages", "temperature", "max_tokens", "seed", "n")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def pool_lines(body: dict) -> dict[int, str]:
    """The ``lineN: text`` rows of the last user message."""
    user = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return {int(i): t for i, t in _LINE.findall(user[-1]["content"])} if user else {}


def claim_of(body: dict) -> str:
    user = [m for m in body.get("messages", []) if m.get("role") == "user"]
    m = re.search(r"^Claim: (.*)$", user[-1]["content"], re.MULTILINE) if user else None
    return m.group(1) if m else ""


def overlap_ids(body: dict, min_overlap: int = 2) -> list[int]:
    """Lines sharing at least ``min_overlap`` words with the claim (a crude annotator)."""
    claim_words = set(_WORD.findall(claim_of(body).lower()))
    return sorted(
        i for i, t in pool_lines(body).items() if len(claim_words & set(_WORD.findall(t.lower()))) >= min_overlap
    )


def overlap_verifier(body: dict) -> str:
    """Answers like an evidence-reading verifier: SUPPORT citing overlapping lines, else NEI."""
    ids = overlap_ids(body)
    if ids:
        return json.dumps({"label": "SUPPORT", "evidence": ids})
    return json.dumps({"label": "NOT_ENOUGH_INFO", "evidence": []})


def stepwise_verifier(body: dict) -> str:
    """Like :func:`overlap_verifier` but cites only the first overlapping line: one line ablated per round."""
    ids = overlap_ids(body)
    if ids:
        return json.dumps({"label": "SUPPORT", "evidence": ids[:1]})
    return json.dumps({"label": "NOT_ENOUGH_INFO", "evidence": []})


def overlap_annotator(body: dict) -> str:
    return json.dumps({"evidence": overlap_ids(body)})


def fit_to_schema(content: str, schema: dict) -> str:
    """The answer a schema-constrained model could give: the object's enum'd fields kept when allowed.

    Handles the flat answer schemas of data_prep/schemas.py: string enums
    (a value outside falls back to the first allowed one) and arrays of integer
    enums (items outside are dropped, duplicates removed), in schema order.
    """
    try:
        obj = json.loads(content)
    except ValueError:
        obj = {}
    obj = obj if isinstance(obj, dict) else {}
    out = {}
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") == "string":
            allowed = prop.get("enum") or [""]
            out[name] = obj.get(name) if obj.get(name) in allowed else allowed[0]
        elif prop.get("type") == "array":
            allowed = (prop.get("items") or {}).get("enum") or []
            items = obj.get(name) if isinstance(obj.get(name), list) else []
            out[name] = list(dict.fromkeys(i for i in items if i in allowed))
    return json.dumps(out)


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog of 5 drops SYNs when a client opens
    # dozens of connections at once; the retransmit (1 s) then looks like a timeout.
    request_queue_size = 512

    def handle_error(self, request, client_address):
        # A client that gave up (timeout fault) closes its socket: not a server error.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@dataclass
class RequestLog:
    model: str
    key: str
    attempt: int
    outcome: str  # "ok" or the fault name
    authorization: str | None = None
    response_format: dict | None = None  # as the request sent it
    at: float = 0.0  # time.monotonic() when the request arrived (retry waits are measured with it)
    session: str | None = None  # the routing header (X-Session-ID) as the request sent it
    claim: str = ""  # the prompt's "Claim:" line


@dataclass
class LocalOpenAIServer:
    responder: Responder = overlap_verifier
    faults: FaultPlan | None = None
    latency: float = 0.0  # seconds added to every answer
    slow_seconds: float = 5.0  # how long a "timeout" fault stalls
    api_key: str | None = None  # when set, other keys get a 401
    host: str = "127.0.0.1"
    port: int = 0
    log: list[RequestLog] = field(default_factory=list)
    # Optional: (body with _choice_index, content) -> a choice's "logprobs" object,
    # returned when the request asks for logprobs (used by the PAVE tests).
    logprobs_fn: Callable[[dict, str], "dict | None"] | None = None
    # When set, every error body (400/401/429/5xx) echoes the request's Authorization
    # header, whole and as the bare token, as careless real servers do: the leak tests.
    echo_auth: bool = False
    # When set, an answer longer than the request's max_tokens (one token = one
    # whitespace-separated word, as in "usage") is cut there with finish_reason "length".
    honor_max_tokens: bool = False
    # "ignore" (default): response_format is logged, not used. "honor": a json_schema
    # response_format fits the answer to the schema (as a grammar-constrained server
    # would). "json_object_only": a json_schema request gets a 400 naming response_format.
    response_format_mode: str = "ignore"
    # Extra headers of every injected error response (400/401/408/409/429/5xx), e.g.
    # {"Retry-After": "1"} or {"retry-after-ms": "250"}: how servers say how long to wait.
    error_headers: dict[str, str] = field(default_factory=dict)
    # When set, every response names this server in an "X-Served-By" header.
    name: str | None = None

    def __post_init__(self):
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------
    def start(self) -> "LocalOpenAIServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle on, the body waits
            # for the client's delayed ACK (~40 ms per request). Real servers set
            # TCP_NODELAY too.
            disable_nagle_algorithm = True

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                server._handle(self)

            def do_GET(self):
                path = self.path.rstrip("/")
                if path.endswith("/models"):
                    server._send_json(self, 200, {"object": "list", "data": []})
                elif path in ("/health", "/v1/health"):
                    server._send_json(self, 200, {"status": "ok"})
                else:
                    server._send_json(self, 404, {"error": {"message": "not found"}})

        self._httpd = _Server((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "LocalOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- bookkeeping ----------------------------------------------------
    def count(self, model: str | None = None, outcome: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.log
                if (model is None or r.model == model) and (outcome is None or r.outcome == outcome)
            )

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()
            self._seen.clear()

    # -- request handling -----------------------------------------------
    def _send_json(self, handler, status: int, obj, raw: bytes | None = None, headers: dict | None = None) -> None:
        data = raw if raw is not None else json.dumps(obj).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        if self.name:
            handler.send_header("X-Served-By", self.name)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _handle(self, handler) -> None:
        if not handler.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(handler, 404, {"error": {"message": f"unknown path {handler.path}"}})
            return
        length = int(handler.headers.get("Content-Length", 0))
        try:
            body = json.loads(handler.rfile.read(length))
        except json.JSONDecodeError:
            self._send_json(handler, 400, {"error": {"message": "invalid JSON body"}})
            return
        arrived = time.monotonic()
        auth = handler.headers.get("Authorization")
        key = body_key(body)
        with self._lock:
            attempt = self._seen[key]
            self._seen[key] += 1
        fault = self.faults(body, attempt) if self.faults else None
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            fault = "401"
        with self._lock:
            self.log.append(RequestLog(body.get("model", ""), key, attempt, fault or "ok", auth,
                                       body.get("response_format"), arrived,
                                       handler.headers.get(SESSION_HEADER), claim_of(body)))
        fmt = (body.get("response_format") or {}).get("type")
        if fault is None and fmt == "json_schema" and self.response_format_mode == "json_object_only":
            self._send_json(handler, 400, {"error": {
                "message": "response_format type 'json_schema' is not supported; use 'json_object'",
                "type": "invalid_request_error", "param": "response_format"}})
            return
        if self.latency:
            time.sleep(self.latency)
        if fault in ERROR_STATUSES:
            self._send_json(handler, ERROR_STATUSES[fault], self._error_body(fault, auth), headers=self.error_headers)
        elif fault == "timeout":
            time.sleep(self.slow_seconds)
            self._answer(handler, body)
        elif fault == "malformed_body":
            self._send_json(handler, 200, None, raw=b'{"id": "x", "choices": [')
        elif fault == "disconnect":
            handler.close_connection = True
            handler.connection.close()
        elif fault == "bad_content":
            self._answer(handler, body, content=BAD_CONTENT)
        else:
            self._answer(handler, body)

    def _error_body(self, fault: str, auth: str | None) -> dict:
        if fault == "401":
            err = {"message": "invalid api key", "type": "auth"}
        elif fault == "400":
            err = {"message": "bad request", "type": "invalid_request_error"}
        else:
            err = {"message": f"injected {fault}", "type": "server"}
        if self.echo_auth:
            token = (auth or "").split(" ", 1)[-1]
            err["message"] += f": you sent {token} (Authorization: {auth})"
            err["you_sent"] = token  # no "Bearer"/"api_key" shape: only the registered key catches it
            err["headers"] = {"authorization": auth}
        return {"error": err}

    def _answer(self, handler, body: dict, content: str | None = None) -> None:
        n = int(body.get("n") or 1)
        if content is not None:
            contents = [content] * n
        else:
            contents = [self.responder(dict(body, _choice_index=i)) for i in range(n)]
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
        if self.response_format_mode == "honor" and schema:
            contents = [fit_to_schema(c, schema) for c in contents]
        cap = body.get("max_tokens") if self.honor_max_tokens else None
        finish = ["length" if cap and len(c.split()) > cap else "stop" for c in contents]
        contents = [" ".join(c.split()[:cap]) if f == "length" else c for c, f in zip(contents, finish)]
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        completion_tokens = sum(len(c.split()) for c in contents)
        resp = {
            "id": "chatcmpl-local",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c},
                    "finish_reason": finish[i],
                    "logprobs": (self.logprobs_fn(dict(body, _choice_index=i), c)
                                 if body.get("logprobs") and self.logprobs_fn else None),
                }
                for i, c in enumerate(contents)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        self._send_json(handler, 200, resp)


def _completion(body: dict, content: str, cached: int = 0) -> bytes:
    prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    return json.dumps({
        "id": "chatcmpl-local", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(content.split()),
                  "total_tokens": prompt + len(content.split()), "prompt_tokens_details": {"cached_tokens": cached}},
    }).encode()


class PrefixCache:
    """A server's prefix cache, in words: how much of a prompt an earlier prompt of the same claim
    on this server already covered (what vLLM reports as ``usage.prompt_tokens_details.cached_tokens``)."""

    def __init__(self):
        self.last: dict[str, list[str]] = {}

    def __call__(self, body: dict) -> int:
        words = [w for m in body.get("messages", []) for w in str(m.get("content", "")).split()]
        claim = claim_of(body)
        before = self.last.get(claim, [])
        self.last[claim] = words
        n = 0
        for a, b in zip(before, words):
            if a != b:
                break
            n += 1
        return n


async def serve_fast(responder: Responder, host: str, port: int, *, name: str | None = None,
                     log_path: str | None = None, latency: float = 0.0,
                     ready: Callable[[int], None] | None = None) -> None:
    """Instant answers on one asyncio loop, HTTP/1.1 keep-alive: a server cheaper than the client it measures.

    ``log_path``: one JSON line per chat request (``session`` header, ``claim``), for tests
    that read what reached which server from another process.
    """
    import asyncio

    log = open(log_path, "a", buffering=1) if log_path else None
    cache = PrefixCache()
    extra = f"X-Served-By: {name}\r\n".encode() if name else b""

    def reply(status: str, data: bytes) -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n").encode() + extra + b"\r\n" + data

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length") or 0)
                raw = await reader.readexactly(n) if n else b""
                path = path.rstrip("/")
                if method == "POST" and path.endswith("/chat/completions"):
                    body = json.loads(raw)
                    if log is not None:
                        log.write(json.dumps({"session": headers.get(SESSION_HEADER.lower()),
                                              "claim": claim_of(body)}) + "\n")
                    if latency:
                        await asyncio.sleep(latency)
                    out = reply("200 OK", _completion(body, responder(body), cache(body)))
                elif method == "GET" and path.endswith("/models"):
                    out = reply("200 OK", b'{"object": "list", "data": []}')
                elif method == "GET" and path in ("/health", "/v1/health"):
                    out = reply("200 OK", b'{"status": "ok"}')
                else:
                    out = reply("404 Not Found", b'{"error": {"message": "not found"}}')
                writer.write(out)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, backlog=1024)
    if ready is not None:
        ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


RESPONDERS = {"verifier": overlap_verifier, "stepwise": stepwise_verifier, "annotator": overlap_annotator}



def spawn(*args: str, pre: tuple = (), **popen):
    """This server in its own process (``args``: its flags): (the process, its base URL once it is READY).

    ``pre`` prefixes the command (e.g. ``taskset -c 0``). The caller ends the process.
    """
    import subprocess
    import sys

    proc = subprocess.Popen([*pre, sys.executable, __file__, "--port", "0", *args], stdout=subprocess.PIPE,
                            text=True, **popen)
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise RuntimeError(f"the local server did not start ({' '.join(args)})")
    return proc, line[1]

def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency", type=float, default=0.0)
    p.add_argument("--role", choices=sorted(RESPONDERS), default="annotator")
    p.add_argument("--fault", choices=FAULTS, help="answer every request with this fault")
    p.add_argument("--echo-auth", action="store_true", help="echo the Authorization header in error bodies")
    p.add_argument("--fast", action="store_true", help="instant answers from one asyncio loop (no faults)")
    p.add_argument("--name", help="name this server in an X-Served-By response header")
    p.add_argument("--log", help="--fast: append one JSON line per chat request to this file")
    args = p.parse_args(argv)
    responder = RESPONDERS[args.role]
    if args.fast:
        import asyncio

        def ready(port: int) -> None:
            print(f"READY http://127.0.0.1:{port}/v1", flush=True)

        try:
            asyncio.run(serve_fast(responder, "127.0.0.1", args.port, name=args.name, log_path=args.log,
                                   latency=args.latency, ready=ready))
        except KeyboardInterrupt:
            pass
        return
    plan = (lambda body, attempt: args.fault) if args.fault else None
    srv = LocalOpenAIServer(responder=responder, latency=args.latency, port=args.port, faults=plan,
                            echo_auth=args.echo_auth, name=args.name).start()
    print(f"READY {srv.base_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
