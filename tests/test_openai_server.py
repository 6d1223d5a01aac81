"""The local OpenAI-compatible server must look like the real API to the openai client."""

import json

import openai
import pytest
from openai_server import LocalOpenAIServer, overlap_annotator

MSGS = [
    {"role": "system", "content": "Verify."},
    {"role": "user", "content": "Claim: the red fox jumps\nDocument:\nline0: a red fox jumps high\nline4: nothing here"},
]


def test_answers_through_openai_client_and_counts():
    with LocalOpenAIServer(api_key="sk-test") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        r = client.chat.completions.create(model="m1", messages=MSGS, temperature=0)
        assert json.loads(r.choices[0].message.content) == {"label": "SUPPORT", "evidence": [0]}
        assert r.usage.prompt_tokens > 0
        assert srv.count("m1") == 1 and srv.count(outcome="ok") == 1


def test_faults_are_deterministic_per_attempt():
    plan = lambda body, attempt: "429" if attempt == 0 else None
    with LocalOpenAIServer(responder=overlap_annotator, faults=plan) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=2)
        r = client.chat.completions.create(model="ann", messages=MSGS)
        assert json.loads(r.choices[0].message.content) == {"evidence": [0]}
        assert [x.outcome for x in srv.log] == ["429", "ok"]


def test_wrong_key_and_malformed_body():
    with LocalOpenAIServer(api_key="right") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=MSGS)
    with LocalOpenAIServer(faults=lambda b, a: "malformed_body") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        with pytest.raises(Exception):
            client.chat.completions.create(model="m", messages=MSGS)
