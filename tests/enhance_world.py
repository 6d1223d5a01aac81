"""A small annotation world for the enhancement tests: records, three annotators with
known picks, a deterministic fault plan, and what all that must produce.

The picks cycle through four patterns whose vote outcome is written out by hand
(EXPECTED), so the tests do not reuse the code they check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from openai_server import claim_of

MODELS = ("ann-a", "ann-b", "ann-c")
NAMES = {"ann-a": "alpha", "ann-b": "beta", "ann-c": "gamma"}
POOL = (0, 1, 2, 3, 5, 8)
MALFORMED = "MALFORMED"
NEI_INDEX = 6  # this record is NOT_ENOUGH_INFO: passed through, never requested

# pattern -> model -> what the model answers
PATTERNS = [
    {"ann-a": [0, 1, 2], "ann-b": [1, 2, 99], "ann-c": [3]},  # 99 is invented
    {"ann-a": [], "ann-b": [], "ann-c": []},
    {"ann-a": [3, 5], "ann-b": MALFORMED, "ann-c": [5]},  # beta abstains
    {"ann-a": [8], "ann-b": ["line8"], "ann-c": [8, 1]},
]
# strict majority (2 of 3), gold [0] always kept
EXPECTED = [[0, 1, 2], [0], [0, 5], [0, 8]]
EXPECTED_ANNOTATIONS = [
    {"alpha": [0, 1, 2], "beta": [1, 2], "gamma": [3]},
    {"alpha": [], "beta": [], "gamma": []},
    {"alpha": [3, 5], "beta": None, "gamma": [5]},
    {"alpha": [8], "beta": [8], "gamma": [1, 8]},
]
EXPECTED_MIN1 = [[0, 1, 2, 3], [0], [0, 3, 5], [0, 1, 8]]

TRANSPORT = {"429", "500", "503", "timeout", "malformed_body", "disconnect"}


def make_records(n: int, *, nei: bool = True) -> list[dict]:
    recs = []
    for k in range(n):
        is_nei = nei and k == NEI_INDEX
        recs.append({
            "id": f"c{k}",
            "dataset": "toy",
            "claim": f"claim number {k} about the topic",
            "label": "NOT_ENOUGH_INFO" if is_nei else ("SUPPORT" if k % 2 else "REFUTE"),
            "sentences": [{"id": s, "text": f"sentence {s} of claim {k}", "doc": "Doc"} for s in POOL],
            "evidence": [] if is_nei else [[0]],
            "source_note": f"kept-{k}",  # an extra field the enhancer must keep
        })
    return recs


def write_records(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def claim_index(body: dict) -> int:
    return int(re.search(r"claim number (\d+)", claim_of(body)).group(1))


def responder(body: dict) -> str:
    picks = PATTERNS[claim_index(body) % 4][body["model"]]
    if picks == MALFORMED:
        return "I think lines three and five matter."
    return json.dumps({"evidence": picks})


def fault_plan(k: int, model: str, attempt: int) -> str | None:
    """Every fault kind appears; each is healed by a later attempt."""
    if model == "ann-a" and k % 5 == 1 and attempt == 0:
        return "429"
    if model == "ann-b" and k % 5 == 2 and attempt < 2:
        return "500"
    if model == "ann-c" and k % 7 == 3 and attempt == 0:
        return "timeout"
    if model == "ann-c" and k % 6 == 4 and attempt == 0:
        return "bad_content"
    if model == "ann-a" and k % 9 == 5 and attempt == 0:
        return "malformed_body"
    if model == "ann-b" and k % 11 == 7 and attempt == 0:
        return "disconnect"
    return None


def faults(body: dict, attempt: int) -> str | None:
    return fault_plan(claim_index(body), body["model"], attempt)


def expected_traffic(k: int, model: str, malformed_retries: int) -> tuple[int, int]:
    """(HTTP requests, answers with a body) the enhancer must send for claim k to model."""
    requests = answers = malformed = 0
    while True:
        fault = fault_plan(k, model, requests)
        requests += 1
        if fault in TRANSPORT:
            continue
        answers += 1
        if fault == "bad_content" or PATTERNS[k % 4][model] == MALFORMED:
            malformed += 1
            if malformed > malformed_retries:
                return requests, answers
            continue
        return requests, answers


def annotators_yaml(path: Path, base_url: str, *, env: str | None = "ENHANCE_TEST_KEY", concurrency: int = 4,
                    timeout: float = 0.5, max_retries: int = 4, malformed_retries: int = 2,
                    envs: dict | None = None) -> Path:
    lines = ["annotators:"]
    for m in MODELS:
        lines += [
            f"  - name: {NAMES[m]}",
            f"    base_url: {base_url}",
            f"    model: {m}",
        ]
        key_env = (envs or {}).get(m, env)
        lines += [f"    api_key_env: {key_env}"] if key_env else []  # None: a keyless server
        lines += [
            f"    max_concurrency: {concurrency}",
            "    temperature: 0.0",
            "    max_tokens: 64",
            f"    timeout: {timeout}",
            f"    max_retries: {max_retries}",
            f"    malformed_retries: {malformed_retries}",
            "    backoff_base: 0.01",
            "    backoff_max: 0.05",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

