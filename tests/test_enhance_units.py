"""Pure parts of the enhancer: annotator YAML, prompt + parser, vote, cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_record_dict

from data_prep.llm.cache import ABSTAIN, OK, AnswerCache, CachedAnswer, request_key
from data_prep.llm.config import ConfigError, load_annotators
from data_prep.enhance.prompt import parse_annotation, render_annotator_prompt
from data_prep.enhance.vote import (
    annotator_agreement,
    enhanced_evidence,
    majority_picks,
    votes_needed,
)
from data_prep.prompts import render_evidence_prompt
from data_prep.records import ClaimRecord

REPO = Path(__file__).resolve().parents[1]

ENTRY = """  - name: {name}
    base_url: http://127.0.0.1:8000/v1
    model: {model}
    api_key_env: SOME_KEY
    max_concurrency: 4
    temperature: 0
    max_tokens: 64
"""


def _yaml(tmp_path, body: str) -> Path:
    p = tmp_path / "ann.yaml"
    p.write_text(body)
    return p


@pytest.mark.parametrize("name", ["paper.yaml", "local.yaml"])
def test_shipped_recipes_load(name, monkeypatch):
    anns = load_annotators(REPO / "recipes" / "annotators" / name)
    assert anns and all(a.api_key_env.isupper() for a in anns)
    if name == "paper.yaml":
        assert [a.model for a in anns] == ["gpt-4o-mini", "gemini-2.5-flash-lite", "Qwen/Qwen2.5-32B-Instruct"]
    monkeypatch.delenv(anns[0].api_key_env, raising=False)
    with pytest.raises(ConfigError, match=f"{anns[0].name}.*{anns[0].api_key_env}.*not set"):
        anns[0].api_key()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda e: e.replace("    max_tokens: 64\n", ""), r"yaml:\d+: annotators\[1\] \('b'\): max_tokens: missing required field"),
        (lambda e: e.replace("max_concurrency: 4", "max_concurrency: 0"), r"ann\.yaml:13: annotators\[1\] \('b'\): max_concurrency: must be >= 1, got 0"),
        (lambda e: e + "    api_key: sk-secret-value\n", r"\[1\].*: api_key: keys never go into this file"),
        (lambda e: e.replace("SOME_KEY", "sk-abc-123"), r"\[1\].*: api_key_env: must be the NAME"),
        (lambda e: e.replace("http://127.0.0.1:8000/v1", "localhost:8000"), r"\[1\].*: base_url: must start with http"),
        (lambda e: e + "    colour: red\n", r"\[1\].*: colour: unknown key"),
        (lambda e: e.replace("model: m-b", "model: m-a"),
         r"\[1\].*same model and decoding settings as annotators\[0\]"),
        (lambda e: e.replace("name: b", "name: a"), r"yaml:\d+: annotators\[1\]: name: duplicate name 'a'"),
    ],
)
def test_config_errors_name_file_entry_and_field(tmp_path, mutate, expected):
    body = "annotators:\n" + ENTRY.format(name="a", model="m-a") + mutate(ENTRY.format(name="b", model="m-b"))
    path = _yaml(tmp_path, body)
    with pytest.raises(ConfigError, match=expected) as info:
        load_annotators(path)
    assert str(info.value).startswith(str(path))
    assert "sk-" not in str(info.value)  # a pasted key is never echoed


def test_config_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_annotators(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="top-level 'annotators:'"):
        load_annotators(_yaml(tmp_path, "- name: a\n"))
    with pytest.raises(ConfigError, match="non-empty list"):
        load_annotators(_yaml(tmp_path, "annotators: []\n"))


def test_duplicate_yaml_key_names_both_lines(tmp_path):
    body = "annotators:\n" + ENTRY.format(name="a", model="m-a").replace(
        "    max_tokens: 64\n", "    max_tokens: 64\n    temperature: 0.7\n")
    path = _yaml(tmp_path, body)
    with pytest.raises(ConfigError, match=r"key 'temperature' is given twice \(lines 7 and 9\)") as info:
        load_annotators(path)
    assert str(info.value).startswith(f"{path}:9")


def test_api_key_env_is_optional_for_keyless_servers(tmp_path, monkeypatch):
    from data_prep.llm.config import NO_KEY

    keyless = ENTRY.format(name="local", model="m-local").replace("    api_key_env: SOME_KEY\n", "")
    anns = load_annotators(_yaml(tmp_path, "annotators:\n" + keyless + ENTRY.format(name="b", model="m-b")))
    assert anns[0].api_key_env is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-reach-a-local-server")
    assert anns[0].api_key() == NO_KEY  # explicit: the openai client would otherwise read OPENAI_API_KEY
    monkeypatch.delenv("SOME_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"'b'.*SOME_KEY, which is not set.*remove 'api_key_env'"):
        anns[1].api_key()
    assert anns[0].endpoint == "http://127.0.0.1:8000/v1 (model 'm-local')"


def test_prompt_uses_the_verifier_pool_layout():
    rec = ClaimRecord.from_dict(make_record_dict())
    msgs = render_annotator_prompt(rec)
    assert msgs[1]["content"] == render_evidence_prompt(rec)[1]["content"]  # same Claim/Document/lineN block
    assert '{"evidence": [IDS]}' in msgs[0]["content"] and "supports or refutes" in msgs[0]["content"]


@pytest.mark.parametrize(
    "text, valid, ids, invented",
    [
        ('{"evidence": [3, 0]}', True, [0, 3], []),
        ('```json\n{"evidence": ["line3", "1", 42]}\n```', True, [1, 3], [42]),
        ('{"evidence": []}', True, [], []),
        ('{"evidence": [0]} and also {"evidence": [1]}', False, [], []),
        ('{"evidence": "0, 3"}', False, [], []),
        ('{"evidence": [true]}', False, [], []),
        ('{"label": "SUPPORT"}', False, [], []),
        ("line 3 matters", False, [], []),
        ("", False, [], []),
    ],
)
def test_parse_annotation(text, valid, ids, invented):
    a = parse_annotation(text, [0, 1, 3])
    assert (a.valid, a.ids, a.invented) == (valid, ids, invented)
    assert a.valid or a.error


def test_strict_majority_of_configured_annotators():
    assert [votes_needed(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    ann = {"a": [1, 2], "b": [2, 5], "c": None}  # c abstained: counts as not picking
    assert majority_picks(ann) == [2]  # 5 has 1 of 3 votes, not 1 of 2
    assert majority_picks(ann, min_votes=1) == [1, 2, 5]
    assert enhanced_evidence([7], ann) == [2, 7]  # gold always stays
    assert enhanced_evidence([7], {"a": None, "b": None, "c": None}) == [7]
    assert majority_picks({"a": [1, 1, 1], "b": [], "c": []}) == []  # one annotator = one vote per id
    assert majority_picks({"a": [4], "b": [4]}) == [4] and majority_picks({"a": [4], "b": []}) == []


def test_annotator_agreement_skips_abstentions():
    got = annotator_agreement([([0], [0, 1]), ([2, 3], [3]), ([5], None)])
    assert got == {"claims_answered": 2, "abstentions": 1, "picked": 3,
                   "precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3)}
    assert annotator_agreement([([0], None)])["precision"] is None


def test_cache_key_and_persistence(tmp_path):
    msgs = [{"role": "user", "content": "x"}]
    k = request_key("m", msgs, {"temperature": 0.0, "max_tokens": 8})
    assert k != request_key("m2", msgs, {"temperature": 0.0, "max_tokens": 8})
    assert k != request_key("m", msgs, {"temperature": 0.7, "max_tokens": 8})
    assert k != request_key("m", msgs, {"temperature": 0.0, "max_tokens": 9})
    assert k != request_key("m", [{"role": "user", "content": "y"}], {"temperature": 0.0, "max_tokens": 8})
    c = AnswerCache(tmp_path / "c.sqlite")
    c.put(k, "m", CachedAnswer(OK, '{"evidence": [1]}', 10, 3))
    c.put("k2", "m", CachedAnswer(ABSTAIN, "junk", 10, 2, error="no JSON"))
    c.close()
    c = AnswerCache(tmp_path / "c.sqlite")
    assert c.get(k) == CachedAnswer(OK, '{"evidence": [1]}', 10, 3, None)
    assert c.get("k2").status == ABSTAIN and c.get("nope") is None and len(c) == 2
    c.close()


def _write(path: Path, rows: list[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_revote_errors_name_file_line_and_field(tmp_path, capsys):
    from data_prep.cli import main

    ok = make_record_dict(id="r1", enhanced_evidence=[0, 3], annotations={"a": [0, 1], "b": [1], "c": None})
    bad = make_record_dict(id="r2", annotations={"a": [0, 9], "b": [], "c": []})
    src = _write(tmp_path / "enh.jsonl", [ok, bad])
    out = tmp_path / "out.jsonl"
    assert main(["enhance", "--records", str(src), "--revote", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: record 'r2': field 'annotations': annotator 'a': ids [9] are not in the pool" in err

    _write(src, [make_record_dict()])
    assert main(["enhance", "--records", str(src), "--revote", "--output", str(out)]) == 2
    assert "no record has 'annotations'" in capsys.readouterr().err

    _write(src, [ok])
    assert main(["enhance", "--records", str(src), "--revote", "--min-votes", "4", "--output", str(out)]) == 2
    assert "--min-votes must be between 1 and the number of annotators (3)" in capsys.readouterr().err
    assert main(["enhance", "--records", str(src), "--revote", "--min-votes", "1", "--output", str(out)]) == 0
    assert ClaimRecord.from_dict(__import__("json").loads(out.read_text())).enhanced_evidence == [0, 1, 3]
    assert main(["enhance", "--records", str(src), "--output", str(out)]) == 2
    assert "--annotators is required" in capsys.readouterr().err


def test_password_in_base_url_is_masked_in_errors(tmp_path):
    from real_fae_core.secrets import scrub

    body = "annotators:\n" + ENTRY.format(name="a", model="m-a").replace(
        "http://127.0.0.1:8000/v1", "https://proxyuser:pw-LEAKCHECK-42@proxy.example/v1")
    (ann,) = load_annotators(_yaml(tmp_path, body))
    assert "LEAKCHECK" not in scrub(f"HTTP 500 from {ann.endpoint}: oops")
    assert "proxy.example" in scrub(ann.endpoint)
