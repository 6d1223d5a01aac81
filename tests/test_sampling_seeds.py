"""Sampled requests outside `fae pave` are seeded per request: enhancement's annotator calls at
temperature > 0 (first asks and re-asks) and the demo's simulated annotators."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from real_fae_core.hashing import derived_seed
from data_prep.llm.client import AnnotatorClient
from data_prep.llm.config import AnnotatorConfig
from data_prep.enhance.prompt import annotation_check, render_annotator_prompt
from data_prep.records import ClaimRecord
from real.demo.annotators import AnnotatorServer
from enhance_world import make_records
from openai_server import LocalOpenAIServer


def _ask(base_url: str, seed: int | None, temperature: float, malformed_retries: int = 2):
    cfg = AnnotatorConfig(name="a", base_url=base_url, model="ann", max_concurrency=1, temperature=temperature,
                          max_tokens=64, timeout=5, max_retries=0, malformed_retries=malformed_retries, seed=seed)
    rec = ClaimRecord.from_dict(make_records(1, nei=False)[0])

    async def go():
        client = AnnotatorClient(cfg, "NO_KEY")
        try:
            pool = [s.id for s in rec.sentences]
            return await client.annotate(render_annotator_prompt(rec), pool, annotation_check(pool))
        finally:
            await client.close()

    return asyncio.run(go())


def test_enhance_reasks_carry_a_new_seed_and_unset_seeds_are_sent_at_temperature_above_zero():
    seeds = []

    def respond(body):  # a server that honours seeds: the answer is a function of the seed
        seeds.append(body.get("seed"))
        return "not an annotation" if body.get("seed") in (5, 0) else json.dumps({"evidence": [0]})

    with LocalOpenAIServer(responder=respond) as srv:
        got = _ask(srv.base_url, seed=5, temperature=0.7)
        assert got.status == "ok" and seeds == [5, derived_seed(5, "re-ask", 1)]
        seeds.clear()
        _ask(srv.base_url, seed=None, temperature=0.7, malformed_retries=0)
        assert seeds == [0]  # no seed configured: still one, so a rerun without the cache asks the same
        seeds.clear()
        _ask(srv.base_url, seed=None, temperature=0.0)
        assert seeds == [None]  # greedy decoding needs none; nothing is added


def test_simulated_annotators_answer_by_request_not_by_arrival():
    rec = ClaimRecord.from_dict(make_records(3, nei=False)[2])

    def post(url, seed):
        body = {"model": "demo-annotator-sloppy", "messages": render_annotator_prompt(rec), "seed": seed}
        req = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())["choices"][0]["message"]["content"]

    with AnnotatorServer() as srv:
        first = [post(srv.base_url, s) for s in range(12)]
        for s in range(12):  # other requests in between change nothing
            post(srv.base_url, 99)
        again = [post(srv.base_url, s) for s in reversed(range(12))][::-1]
    assert first == again and len(set(first)) > 1  # the seed matters, the arrival order does not
