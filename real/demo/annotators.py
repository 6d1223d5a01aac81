"""Simulated annotator LLMs for the demo's `real-data enhance` (a simulation, not models).

``real-demo`` needs annotators to exercise evidence enhancement, and the demo
must run offline on a CPU, so :class:`AnnotatorServer` plays them: a small
OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 (stdlib
``http.server`` in a thread) serving three model names of different quality.
Each reads the enhancement prompt (``data_prep.enhance.prompt``: the claim and
the ``lineN: text`` rows), finds the lines that prove or refute the claim — in
the demo world, the lines about the claim's "attribute of entity" — then
misses each of them at its own rate and adds one random wrong line at its own
rate. Its randomness is a function of (request seed, model, messages) only,
so a rerun gives the same answers the cache holds. Nothing here is an LLM;
it stands in for GPT-4o-mini, Gemini and Qwen so that the real client, the
real majority vote and the real cache run end to end.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.hashing import keyed_rng, sha256_text

_CLAIM = re.compile(r"^Claim: (.*)$", re.MULTILINE)
_LINE = re.compile(r"^line(\d+): (.*)$", re.MULTILINE)
_FACT = re.compile(r"^The (\S+) of (\S+) is \S+ \.$")


@dataclass(frozen=True)
class SimulatedAnnotator:
    """One annotator's quality: how often it misses a proving line, and adds a wrong one."""

    model: str
    miss_rate: float
    add_rate: float


ANNOTATORS = (
    SimulatedAnnotator("demo-annotator-careful", miss_rate=0.05, add_rate=0.03),
    SimulatedAnnotator("demo-annotator-average", miss_rate=0.15, add_rate=0.10),
    SimulatedAnnotator("demo-annotator-sloppy", miss_rate=0.35, add_rate=0.25),
)


def subject(sentence: str) -> tuple[str, str] | None:
    """``(attribute, entity)`` of a world sentence ("The capital of Zorvia is Quellin ."), else None."""
    m = _FACT.match(sentence.strip())
    return (m.group(1), m.group(2)) if m else None


def proving_lines(claim: str, lines: dict[int, str]) -> list[int]:
    """Ids of the lines about the claim's attribute of entity: in this world they prove or refute it."""
    want = subject(claim)
    return sorted(i for i, text in lines.items() if want is not None and subject(text) == want)


def annotate(annotator: SimulatedAnnotator, messages: list[dict], seed: int = 0) -> list[int]:
    """The annotator's picks for one prompt: the proving lines, some missed, maybe one wrong line added."""
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    claim = _CLAIM.search(user)
    lines = {int(i): t for i, t in _LINE.findall(user)}
    key = json.dumps([seed, annotator.model, messages], sort_keys=True)
    rng = keyed_rng(sha256_text(key))
    truth = proving_lines(claim.group(1) if claim else "", lines)
    picks = [i for i in truth if rng.random() >= annotator.miss_rate]
    wrong = sorted(set(lines) - set(truth))
    if wrong and rng.random() < annotator.add_rate:
        picks.append(rng.choice(wrong))
    return sorted(picks)


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog of 5 drops SYNs when the client opens dozens
    # of connections at once; the retransmit (1 s) then stalls the run or looks like a timeout.
    request_queue_size = 512
    daemon_threads = True


class AnnotatorServer:
    """The three simulated annotators behind one OpenAI-compatible endpoint on 127.0.0.1.

    ``with AnnotatorServer() as srv: srv.base_url``. The request's ``seed``
    (the annotator YAML's ``seed``, part of the enhance cache key) seeds the
    answers; an unknown model name gets a 404 as from a real server.
    """

    def __init__(self, annotators: tuple[SimulatedAnnotator, ...] = ANNOTATORS, host: str = "127.0.0.1"):
        self.annotators = {a.model: a for a in annotators}
        self.host, self.port = host, 0
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        """The endpoint to give an annotator YAML (``http://host:port/v1``); the port is known once started."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "AnnotatorServer":
        """Serve the annotators' chat completions on a free port, from a daemon thread; the server itself."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body in two writes: no delayed-ACK stall

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                try:
                    body = json.loads(self.rfile.read(length))
                except ValueError:
                    return self._send(400, {"error": {"message": "invalid JSON body"}})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"unknown path {self.path}"}})
                annotator = server.annotators.get(body.get("model"))
                if annotator is None:
                    return self._send(404, {"error": {"message": f"model {body.get('model')!r} not served here; "
                                                      f"models: {', '.join(server.annotators)}"}})
                self._send(200, server.completion(annotator, body))

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = _Server((self.host, self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Shut the server down and free its port (a no-op when not running)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "AnnotatorServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @staticmethod
    def completion(annotator: SimulatedAnnotator, body: dict) -> dict:
        """A chat.completion answer ``{"evidence": [ids]}``; usage counts whitespace words."""
        messages = body.get("messages") or []
        content = json.dumps({"evidence": annotate(annotator, messages, int(body.get("seed") or 0))})
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        return {
            "id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": annotator.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content.split()),
                      "total_tokens": prompt_tokens + len(content.split())},
        }


def write_annotators_yaml(path: str | Path, base_url: str, seed: int = 0,
                          annotators: tuple[SimulatedAnnotator, ...] = ANNOTATORS) -> Path:
    """An annotators file for `real-data enhance` (recipes/annotators/*.yaml format) pointing at the server."""
    lines = ["# Written by real-demo: the simulated annotators of real/demo/annotators.py (a keyless local",
             "# server, so no api_key_env). Same format as recipes/annotators/*.yaml.", "annotators:"]
    for a in annotators:
        lines += [f"  - name: {a.model}", f"    base_url: {base_url}", f"    model: {a.model}",
                  "    max_concurrency: 16", "    temperature: 0.0", "    max_tokens: 64",
                  "    timeout: 30", "    max_retries: 2", f"    seed: {seed}", ""]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines))
    return path


def enhancement_quality(records) -> dict:
    """Micro precision/recall of ``enhanced_evidence`` (and of gold, and of each annotator's picks)
    against the world's true proving lines (``extra["proving_ids"]``)."""
    def prf(pick) -> dict:
        tp = n_pred = n_true = 0
        for r in records:
            got = pick(r)
            if got is None:
                continue
            truth = set(r.extra["proving_ids"])
            tp += len(set(got) & truth)
            n_pred += len(set(got))
            n_true += len(truth)
        return {"precision": tp / n_pred if n_pred else None, "recall": tp / n_true if n_true else None}

    names = sorted({n for r in records for n in (r.extra.get("annotations") or {})})
    out = {"n_claims": len(records),
           "n_incomplete_gold": sum(bool(r.extra.get("incomplete_gold")) for r in records),
           "gold": prf(lambda r: r.gold_ids), "enhanced": prf(lambda r: r.enhanced_evidence)}
    out["annotators"] = {n: prf(lambda r, n=n: (r.extra.get("annotations") or {}).get(n)) for n in names}
    return out
