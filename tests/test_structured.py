"""Schema-constrained decoding (issue 18): schemas, the hf (xgrammar) and openai backends, the run fingerprint."""

import json
from pathlib import Path

import pytest
from fae_helpers import write_checkcovid
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_server import (
    LocalOpenAIServer,
    overlap_annotator,
    overlap_verifier,
    pool_lines,
)

from data_prep.prompts import render_evidence_prompt, render_knowledge_prompt
from data_prep.records import LABELS, load_records
from data_prep.schemas import (
    annotator_schema,
    answer_schema,
    schema_for_prompt,
    shown_pool_ids,
)
from fae.ablation.runio import read_claims
from fae.cli import main


@pytest.fixture(scope="module")
def cc_records(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "cc.jsonl", n=6)


# -- schemas ----------------------------------------------------------------


def test_answer_schema_puts_label_first_and_limits_ids_to_the_pool():
    schema = answer_schema([7, 0, 3])
    assert list(schema["properties"]) == ["label", "evidence"]  # soft-FAE reads the label position
    assert schema["properties"]["label"]["enum"] == list(LABELS)
    assert schema["properties"]["evidence"]["items"]["enum"] == [0, 3, 7]
    assert schema["additionalProperties"] is False
    assert annotator_schema([2, 5])["properties"]["evidence"]["items"]["enum"] == [2, 5]
    assert answer_schema([])["properties"]["evidence"] == {"type": "array", "maxItems": 0}


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=12, unique=True),
       st.data())
def test_shown_pool_ids_reads_back_exactly_the_pool_shown(ids, data):
    """Whatever the sentence and claim texts (newlines, 'lineN:' look-alikes), the schema is the pool shown."""
    from data_prep.records import ClaimRecord, Sentence

    text = st.text(alphabet=st.sampled_from(list("ab :\n\tline0123Document")), max_size=30)
    sents = [Sentence(id=i, text=data.draw(text) or "x") for i in ids]
    rec = ClaimRecord(id="r", dataset="t", claim=data.draw(text) or "c", label="SUPPORT",
                      sentences=sents, evidence=[[ids[0]]])
    shown = data.draw(st.lists(st.sampled_from(ids), unique=True))
    assert shown_pool_ids(render_evidence_prompt(rec, shown)) == [i for i in ids if i in shown]
    assert shown_pool_ids(render_knowledge_prompt(rec)) is None
    assert schema_for_prompt(render_knowledge_prompt(rec))["properties"]["evidence"]["maxItems"] == 0


# -- the grammar: bounded in every part -----------------------------------------


def grammar_accepts(schema, text: str) -> bool:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from fae.backends.constrained import answer_grammar

    return _is_grammar_accept_string(xgr.Grammar.from_ebnf(answer_grammar(schema)), text)


def test_grammar_admits_the_spaced_and_the_compact_layout_and_nothing_unbounded():
    """One optional space after ':' and ',' (a word-level vocabulary has no space token), never two;
    ids of the pool only, unique, ascending, at most maxItems."""
    schema = answer_schema([12, 0, 7, 3], max_evidence=2)
    assert schema["properties"]["evidence"]["maxItems"] == 2
    for ok in ['{"label": "SUPPORT", "evidence": [0, 3]}', '{"label":"SUPPORT","evidence":[0,3]}',
               '{"label":"REFUTE", "evidence":[7,12]}', '{"label": "NOT_ENOUGH_INFO", "evidence": []}']:
        assert grammar_accepts(schema, ok), ok
    for bad in ['{"label":  "SUPPORT", "evidence": [0, 3]}', '{"label": "SUPPORT", "evidence": [0,\n3]}',
                '{"label": "SUPPORT", "evidence": [0, 3] }', ' {"label": "SUPPORT", "evidence": []}',
                '{"label": "SUPPORT", "evidence": [0, 3, 7]}', '{"label": "SUPPORT", "evidence": [3, 0]}',
                '{"label": "SUPPORT", "evidence": [3, 3]}', '{"label": "SUPPORT", "evidence": [5]}',
                '{"label": "MAYBE", "evidence": []}']:
        assert not grammar_accepts(schema, bad), bad
    assert grammar_accepts(annotator_schema([4, 9]), '{"evidence": [4, 9]}')
    assert not grammar_accepts(answer_schema(None), '{"label": "SUPPORT", "evidence": [0]}')


@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 1500), max_size=14, unique=True), st.one_of(st.none(), st.integers(0, 16)))
def test_max_answer_chars_is_the_longest_answer_the_grammar_admits(ids, cap):
    """Against a second measure: the training target's own layout of the longest answer (the longest
    label and the `cap` longest ids) has exactly that length, is admitted, and one id more is not."""
    from data_prep.prompts import format_answer
    from fae.backends.constrained import max_answer_chars, max_answer_tokens

    schema = answer_schema(ids, max_evidence=cap)
    k = len(ids) if cap is None else min(cap, len(ids))
    longest = sorted(ids, key=lambda i: (-len(str(i)), i))[:k]
    text = format_answer("NOT_ENOUGH_INFO", longest)
    assert max_answer_chars(schema) == len(text)
    assert grammar_accepts(schema, text)
    assert max_answer_tokens([answer_schema([]), schema]) == len(text) + 1
    if k < len(ids):
        more = sorted(set(longest) | {next(i for i in ids if i not in longest)})
        assert not grammar_accepts(schema, format_answer("NOT_ENOUGH_INFO", more))


# -- hf backend through xgrammar ------------------------------------------------


def hf_run(records, out, model, *extra):
    return main(["run", "--records", str(records), "--output", str(out), "--model", str(model),
                 "--rounds", "3", "--batch-size", "4", "--max-new-tokens", "64", "--no-progress", *extra])


@pytest.mark.slow
def test_random_tiny_model_under_the_constraint_answers_validly_in_every_round(cc_records, tiny_llama, tmp_path):
    """The random model answers blank lines unconstrained (0% valid); constrained, every round of
    a real `fae run` parses and cites only ids of the pool it was shown."""
    assert hf_run(cc_records, tmp_path / "free", tiny_llama) == 0
    free = [r for c in read_claims(tmp_path / "free" / "claims.jsonl") for r in c["rounds"]]
    assert not any(r["valid"] for r in free)

    assert hf_run(cc_records, tmp_path / "cd", tiny_llama, "--constrained-decoding") == 0
    claims = read_claims(tmp_path / "cd" / "claims.jsonl")
    rounds = [r for c in claims for r in c["rounds"]]
    assert len(claims) == len(load_records(cc_records)) and len(rounds) == 4 * len(claims)
    assert all(r["valid"] for r in rounds)
    assert all(r["hallucinated"] == [] and set(r["cited"]) <= set(r["pool_ids"]) for r in rounds)
    config = json.loads((tmp_path / "cd" / "config.json").read_text())
    assert config["constrained_decoding"] is True
    assert "constrained decoding: on" in (tmp_path / "cd" / "report.md").read_text()
    log = [json.loads(x) for x in (tmp_path / "cd" / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["backend_stats"]["constrained_prompts"] > 0


def random_model(out, arch: str, seed: int, weight_scale: float):
    """A randomly initialised model: the tiny Llama/Qwen of tiny_models, or the demo base's own config
    and word-level tokenizer with fresh weights; weights x ``weight_scale`` (x5: answers depend on the prompt)."""
    import torch
    from tiny_models import build_tiny_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if arch == "demo":
        base = Path(__file__).resolve().parents[1] / "real" / "demo" / "base"
        torch.manual_seed(seed)
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
        lm.generation_config = GenerationConfig.from_pretrained(base)
        AutoTokenizer.from_pretrained(base).save_pretrained(out)
    else:
        build_tiny_model(out, arch, seed=seed)
        lm = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(weight_scale)
    lm.save_pretrained(out)
    return out


def pool_shapes(arch: str = "llama") -> list:
    """Claim only (None), every sentence ablated ([]), one, five, thirty, sparse ids (the demo's word-level
    vocabulary writes ids 0-31 only, as its world's pools are)."""
    sparse = [3, 17, 22, 31] if arch == "demo" else [3, 17, 58, 102, 230, 1999]
    return [None, [], [0], [0, 1, 2, 3, 4], list(range(30)), sparse]


def pool_prompts(shapes: list) -> list:
    """One prompt per pool shape, all of the same claim."""
    from data_prep.records import ClaimRecord, Sentence

    sents = [Sentence(id=i, text=f"Sentence {i}: the trial found an effect in {i} patients.")
             for i in sorted(set().union(*(p or () for p in shapes)))]
    rec = ClaimRecord(id="r", dataset="t", claim="The vaccine reduces severe disease.", label="SUPPORT",
                      sentences=sents, evidence=[[0]])
    return [render_knowledge_prompt(rec) if p is None else render_evidence_prompt(rec, p) for p in shapes]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "demo"])
@pytest.mark.parametrize("seed,weight_scale", [(0, 1.0), (1, 5.0), (2, 5.0)])
def test_a_random_model_always_completes_a_parseable_answer_citing_only_the_pool(tmp_path, arch, seed,
                                                                                 weight_scale):
    """A random model (real chat templates; the demo's word-level tokenizer has no space token) under
    the constraint, max_new_tokens far too small: every answer finishes at its stop token, parses, and
    cites unique ids of the pool it was shown (none for a claim-only or empty pool)."""
    from data_prep.prompts import parse_answer
    from fae.ablation.engine import named_ids_in_order
    from fae.backends.constrained import max_answer_tokens
    from fae.backends.hf import HFBackend

    model = random_model(tmp_path / arch, arch, seed, weight_scale)
    backend = HFBackend({"model": str(model), "device": "cpu", "batch_size": 3, "max_new_tokens": 4,
                         "constrained_decoding": True, "label_probs": False})
    shapes = pool_shapes(arch)
    prompts = pool_prompts(shapes)
    answers = backend.generate(prompts)
    for pool, answer in zip(shapes, answers):
        parsed = parse_answer(answer.text, pool or [])
        named = named_ids_in_order(answer.text)
        assert answer.finish_reason == "stop" and parsed.valid, (pool, answer)
        assert set(named) <= set(pool or []) and len(named) == len(set(named)), (pool, answer.text)
    schemas = [schema_for_prompt(m) for m in prompts]
    assert backend.stats["max_new_tokens_raised_to"] == max_answer_tokens(schemas)


@pytest.mark.slow
def test_the_evidence_cap_and_a_vocabulary_that_cannot_write_the_answer(tmp_path, tiny_llama):
    """maxItems binds in generation; a grammar the tokenizer cannot continue stops with one clear line
    instead of masking every token until max_new_tokens (the demo vocabulary has no token ' ')."""
    from fae.backends.constrained import GrammarCache, SchemaLogitsProcessor
    from fae.backends.hf import HFBackend, generate_batched

    from real_fae_core.errors import UserError
    from data_prep.prompts import encode_chat, parse_answer

    backend = HFBackend({"model": str(random_model(tmp_path / "m", "llama", 3, 5.0)), "device": "cpu",
                         "constrained_decoding": True, "label_probs": False})
    prompts = pool_prompts(pool_shapes())[3:]
    ids = [encode_chat(backend.tok, m) for m in prompts]
    schemas = [answer_schema(shown_pool_ids(m), max_evidence=1) for m in prompts]
    for m, g in zip(prompts, generate_batched(backend.lm, backend.tok, ids, backend.gc, 4, schemas=schemas,
                                              constraint=backend.constraint)):
        assert parse_answer(g.text, shown_pool_ids(m)).valid and len(parse_answer(g.text, []).hallucinated) <= 1

    demo = HFBackend({"model": str(random_model(tmp_path / "demo", "demo", 0, 1.0)), "device": "cpu",
                      "constrained_decoding": True, "label_probs": False})
    cache: GrammarCache = demo.constraint.cache
    needs_a_space = cache.compiler.compile_grammar('root ::= "{\\"label\\": \\"SUPPORT\\"}"')
    x = torch_tensor([encode_chat(demo.tok, pool_prompts(pool_shapes("demo"))[2])])
    with pytest.raises(UserError, match="no token of the model's vocabulary continues the answer after 1 "):
        demo.lm.generate(input_ids=x, attention_mask=x * 0 + 1, generation_config=demo.gc,
                         logits_processor=[SchemaLogitsProcessor(cache, [needs_a_space])])


def torch_tensor(rows):
    import torch

    return torch.tensor(rows, dtype=torch.long)


# -- fingerprint, report, compare ---------------------------------------------------


def test_compare_refuses_constrained_against_unconstrained_unless_allowed(tmp_path, capsys):
    from fae_helpers import write_run

    a, b = write_run(tmp_path / "sft", 0), write_run(tmp_path / "real", 1)
    config = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**config, "constrained_decoding": True}))
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "cmp"), "--bootstrap", "50"]) == 2
    err = capsys.readouterr().err
    assert "--constrained-decoding" in err and "--allow-mixed-decoding" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "cmp" / "compare.json").exists()
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "cmp"), "--bootstrap", "50",
                 "--allow-mixed-decoding"]) == 0


def test_constrained_setting_is_in_the_fingerprint(tmp_path):
    from fae.ablation import runio

    old = {"claim_set_sha256": "x", "claim_ids": ["a"], "n_claims": 1}  # a run made before the option
    (tmp_path / "config.json").write_text(json.dumps(old))
    runio.check_resume(tmp_path, {**old, "constrained_decoding": False})  # unconstrained resumes it
    with pytest.raises(runio.UserError, match="constrained_decoding"):
        runio.check_resume(tmp_path, {**old, "constrained_decoding": True})


# -- openai backend: response_format ------------------------------------------------


def openai_run(records, out, base_url, *extra):
    return main(["run", "--backend", "openai", "--model", "weak", "--base-url", base_url,
                 "--records", str(records), "--output", str(out), "--rounds", "2", "--concurrency", "4",
                 "--request-timeout", "5", "--backoff-base", "0.01", "--no-progress", *extra])


def weak_then_wrong_ids(body):
    """A weak model: prose unless a schema constrains it, and then it still reaches for id 999."""
    if "response_format" not in body:
        return "I think the claim is supported by line 1."
    return json.dumps({"label": "SUPPORT", "evidence": [999] + sorted(shown_pool_ids(body["messages"]))[:1]})


def test_openai_sends_each_prompt_its_schema_and_a_honouring_server_makes_answers_valid(cc_records, tmp_path):
    with LocalOpenAIServer(responder=weak_then_wrong_ids, response_format_mode="honor") as srv:
        assert openai_run(cc_records, tmp_path / "free", srv.base_url) == 0
        assert all(r.response_format is None for r in srv.log)
        srv.reset_log()
        assert openai_run(cc_records, tmp_path / "cd", srv.base_url, "--constrained-decoding") == 0
        sent = [r.response_format for r in srv.log]
    free = [r for c in read_claims(tmp_path / "free" / "claims.jsonl") for r in c["rounds"]]
    assert not any(r["valid"] for r in free)
    claims = read_claims(tmp_path / "cd" / "claims.jsonl")
    # every question asked: the rounds, the controls and the sufficiency pools, each with its own pool's schema
    asked = [r for c in claims for r in c["rounds"] + [x for x in c["control"] if "skipped" not in x]
             + [c[k] for k in ("gold_only", "cited_only") if "skipped" not in c[k]]
             + list(c["size_sweep"].get("rounds") or [])]
    rounds = [r for r in asked if not r["reused"]]
    assert sent and all(f["type"] == "json_schema" for f in sent)
    assert len(sent) == len(rounds)
    schemas = sorted(json.dumps(f["json_schema"]["schema"], sort_keys=True) for f in sent)
    assert schemas == sorted(json.dumps(answer_schema(r["pool_ids"]), sort_keys=True) for r in rounds)
    assert all(r["valid"] and r["hallucinated"] == [] for r in asked)


def test_openai_falls_back_to_json_object_once_per_run(cc_records, tmp_path):
    with LocalOpenAIServer(responder=overlap_verifier, response_format_mode="json_object_only") as srv:
        assert openai_run(cc_records, tmp_path / "run", srv.base_url, "--constrained-decoding",
                          "--concurrency", "1", "--max-retries", "0") == 0
        kinds = [(r.response_format or {}).get("type") for r in srv.log]
    assert kinds[0] == "json_schema" and kinds.count("json_schema") == 1  # remembered for the run
    assert set(kinds[1:]) == {"json_object"}
    log = json.loads((tmp_path / "run" / "runs.jsonl").read_text().splitlines()[-1])
    assert log["backend_stats"]["json_object_fallback"] == 1 and log["backend_stats"]["retries"] == 0


# -- annotators: per-annotator constrained_decoding -----------------------------------


def annotators_file(path, base_url, constrained: dict[str, bool]):
    lines = ["annotators:"]
    for name, on in constrained.items():
        lines += [f"  - name: {name}", f"    base_url: {base_url}", f"    model: {name}",
                  "    max_concurrency: 2", "    temperature: 0.0", "    max_tokens: 64",
                  "    malformed_retries: 1", "    max_retries: 0"]
        lines += ["    constrained_decoding: true"] if on else []
    path.write_text("\n".join(lines) + "\n")
    return path


def prose_unless_constrained(body):
    if "response_format" not in body:
        return "The first lines look relevant."
    ids = sorted(int(i) for i in pool_lines(body))
    return json.dumps({"evidence": [999] + ids[:2]})  # the server's fit drops the invented id


def test_annotators_send_their_schema_only_when_constrained_and_cache_keys_differ(cc_records, tmp_path):
    from data_prep.cli import main as data_main
    from data_prep.enhance.prompt import parse_annotation

    recs = load_records(cc_records)
    ann = annotators_file(tmp_path / "ann.yaml", "http://127.0.0.1:1/v1", {"free": False, "held": True})
    with LocalOpenAIServer(responder=prose_unless_constrained, response_format_mode="honor") as srv:
        annotators_file(ann, srv.base_url, {"free": False, "held": True})
        args = ["enhance", "--records", str(cc_records), "--annotators", str(ann),
                "--output", str(tmp_path / "out.jsonl"), "--cache", str(tmp_path / "c.sqlite"), "--no-progress"]
        assert data_main(args) == 0
        held = [r for r in srv.log if r.model == "held"]
        free = [r for r in srv.log if r.model == "free"]
        assert all(r.response_format is None for r in free)
        assert sorted(json.dumps(r.response_format["json_schema"]["schema"], sort_keys=True) for r in held) \
            == sorted(json.dumps(annotator_schema(rec.pool_ids), sort_keys=True) for rec in recs)
        out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert all(o["annotations"]["free"] is None for o in out)  # abstained
        assert all(o["annotations"]["held"] == sorted(rec.pool_ids)[:2] for o, rec in zip(out, recs))
        assert all(parse_annotation(json.dumps({"evidence": o["annotations"]["held"]}), rec.pool_ids).valid
                   for o, rec in zip(out, recs))
        # the setting is part of the cache key: turning it on for "free" asks again
        srv.reset_log()
        annotators_file(ann, srv.base_url, {"free": True, "held": True})
        assert data_main(args) == 0  # the same cache
        assert {r.model for r in srv.log} == {"free"} and len(srv.log) == len(recs)


def test_annotator_falls_back_to_json_object(cc_records, tmp_path):
    from data_prep.cli import main as data_main

    with LocalOpenAIServer(responder=overlap_annotator,
                           response_format_mode="json_object_only") as srv:
        ann = annotators_file(tmp_path / "ann.yaml", srv.base_url, {"held": True})
        assert data_main(["enhance", "--records", str(cc_records), "--annotators", str(ann),
                          "--output", str(tmp_path / "out.jsonl"), "--no-progress"]) == 0
        kinds = [(r.response_format or {}).get("type") for r in srv.log]
    assert kinds.count("json_schema") <= 2  # max_concurrency 2: requests already in flight
    assert kinds.count("json_object") == len(load_records(cc_records))


# -- fae pave (sampling, hf) ---------------------------------------------------------


@pytest.mark.slow
def test_pave_samples_under_the_constraint_are_all_valid(tmp_path, tiny_llama):
    """n sampled rows per prompt each get the prompt's schema (claim-only prompts: evidence [])."""
    from helpers import make_record_dict

    from data_prep.prompts import parse_answer
    from data_prep.records import save_records

    recs = [make_record_dict(id=f"r{k}", claim=f"Claim number {k} holds.",
                             label="SUPPORT" if k % 2 == 0 else "REFUTE",
                             counterfactual_sentences=[{"id": 0, "text": f"FAKE statement {k}."}]) for k in range(4)]
    save_records(recs, tmp_path / "eval.jsonl")
    out = tmp_path / "pave"
    assert main(["pave", "--records", str(tmp_path / "eval.jsonl"), "--backend", "hf", "--model", str(tiny_llama),
                 "--samples", "3", "--temperature", "1.0", "--max-new-tokens", "48", "--output", str(out),
                 "--no-progress", "--tune-split", "0.5", "--constrained-decoding"]) == 0
    assert json.loads((out / "config.json").read_text())["constrained_decoding"] is True
    pools = {r["id"]: [s["id"] for s in r["sentences"]] for r in recs}
    for line in map(json.loads, (out / "samples.jsonl").read_text().splitlines()):
        for cond, c in line["conditions"].items():
            for raw in c["raw"]:
                parsed = parse_answer(raw, pools[line["id"]])
                assert parsed.valid and not parsed.hallucinated, (cond, raw)
                if cond == "claim_only":
                    assert parsed.cited == []


def test_yaml_option_must_be_a_boolean(cc_records, tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"records: {cc_records}\noutput: {tmp_path / 'run'}\nmodel: m\nconstrained_decoding: 'on'\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "run.yaml:4: constrained_decoding: must be true or false, got str ('on')" in capsys.readouterr().err
