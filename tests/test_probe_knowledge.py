"""What h(K) stands for: `fae probe` answers every claim-only prompt and flags an abstaining reference.

The verifiers here are real Hugging Face models that answer one fixed
label to every prompt: a one-layer Llama whose attention and MLP write
nothing, so the state at a position is its token's embedding, and whose
output head maps each token of the chain "<|end_header_id|> {"label": ...
[]} <|eot_id|>" to the next. Greedy decoding through transformers then
writes that answer whatever the claim, which is what a REAL-trained
verifier does on a claim-only prompt (NOT_ENOUGH_INFO) or a credulous one
(SUPPORT).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from probe_data import make_lora_adapter, make_records, make_run_dir, write_jsonl

from real_fae_core.labels import NOT_ENOUGH_INFO, REFUTE, SUPPORT
from fae.cli import main
from fae.probes.knowledge import abstaining, invalid_reference, label_shares, reference_note
from fae.probes.report import common_subset_rounds


def test_label_shares_count_each_label_and_invalid_answers():
    got = label_shares([SUPPORT, None, NOT_ENOUGH_INFO, NOT_ENOUGH_INFO, "maybe"],
                       [SUPPORT, REFUTE, REFUTE, NOT_ENOUGH_INFO, SUPPORT])
    assert got["counts"] == {SUPPORT: 1, REFUTE: 0, NOT_ENOUGH_INFO: 2, "invalid": 2}
    assert got["shares"][NOT_ENOUGH_INFO] == pytest.approx(0.4)
    assert got["correct"] == pytest.approx(2 / 5)
    assert not abstaining(got) and reference_note(got, "verifier") is None  # 40%: not a majority
    most = label_shares([NOT_ENOUGH_INFO] * 3 + [SUPPORT] * 2)
    assert abstaining(most) and "60%" in reference_note(most, "verifier")
    assert "--knowledge-reference base" in reference_note(most, "verifier")
    assert "base model" in reference_note(most, "base") and "--knowledge-reference" not in reference_note(most, "base")
    assert label_shares([])["shares"][SUPPORT] is None and not abstaining(label_shares([]))


def test_a_reference_that_answers_nothing_valid_is_flagged():
    """A base that writes prose to every claim-only prompt: h(K) is no verdict at all, and the note says so."""
    prose = label_shares([None] * 4)
    assert invalid_reference(prose) and not abstaining(prose)
    assert reference_note(prose, "base").startswith("invalid reference: none of the base model's answers to the 4")
    almost = label_shares([None] * 3 + [SUPPORT])
    assert not invalid_reference(almost) and reference_note(almost, "base") is None
    assert not invalid_reference(label_shares([]))


def test_common_subset_reads_every_probe_on_the_same_claims():
    """Per round, only claims defined in every probe count; each probe's mean is its mean over exactly those."""
    a = {"c1": [None, 0.1, 0.5], "c2": [None, 0.3, None], "c3": [None, 0.9, 0.7], "only-a": [None, 1.0, 1.0]}
    b = {"c1": [None, 0.2, 0.4], "c2": [None, None, 0.6], "c3": [None, 0.4, 0.8]}
    r1, r2 = common_subset_rounds([a, b], n_resamples=200, seed=0)
    assert (r1["round"], r1["n"], r2["n"]) == (1, 2, 2)  # round 1: c1, c3 (c2 undefined in b); round 2: c1, c3
    assert r1["cells"][0]["mean"] == pytest.approx((0.1 + 0.9) / 2) and r1["cells"][1]["mean"] == pytest.approx(0.3)
    assert r2["cells"][0]["mean"] == pytest.approx(0.6) and r2["cells"][1]["mean"] == pytest.approx(0.6)
    assert all(c["n"] == r["n"] for r in (r1, r2) for c in r["cells"])
    assert common_subset_rounds([a, {"zz": [None, 0.5]}], n_resamples=0, seed=0) == []  # no common claim


def one_answer_model(out: Path, label: str) -> Path:
    """A real Llama checkpoint (word-level tokenizer, Llama-3 chat template) that always answers ``label``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from data_prep.prompts import encode_chat, format_answer, render_knowledge_prompt
    from real.demo.base_model import build_word_tokenizer
    from real.demo.world import build_world, make_split

    world = build_world(n_entities=12, seed=0)
    tok = build_word_tokenizer(world)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    rec = make_split(world, list(world.facts.values())[:1], seed=0, prefix="x")[0]
    chain = [encode_chat(tok, render_knowledge_prompt(rec))[-1],
             *tok.convert_tokens_to_ids(format_answer(label, []).split()), eot]
    assert len(set(chain)) == len(chain) and tok.unk_token_id not in chain
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=eot,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:  # nothing is added to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.zero_()
        for token, successor in zip(chain, chain[1:]):
            head[successor] += 20 * emb[token] / emb[token].norm()
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[eot],
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def world_run(tmp_path_factory):
    """Claims of the demo world (every word in the word-level vocabulary) and a hand-built FAE run over them."""
    from real.demo.world import build_world, make_split

    base = tmp_path_factory.mktemp("knowledge")
    world = build_world(n_entities=12, seed=0)
    recs = [r.to_dict() for r in make_split(world, list(world.facts.values())[:10], seed=3, prefix="w")]
    records = write_jsonl(base / "records.jsonl", recs)
    return make_run_dir(base / "run", records, recs, rounds=2), recs


def _probe_report(tmp_path, dirs, labels) -> str:
    assert main(["probe-report", *map(str, dirs), "--names", *labels, "--output", str(tmp_path / "rep")]) == 0
    return (tmp_path / "rep" / "dirk.md").read_text()


@pytest.mark.slow
def test_an_always_abstaining_verifier_is_flagged_and_a_deciding_one_is_not(world_run, tmp_path, capsys):
    run_dir, recs = world_run
    golds = [r["label"] for r in recs]
    assert {SUPPORT, REFUTE} <= set(golds)
    probes = {}
    for name, label in (("abstainer", NOT_ENOUGH_INFO), ("believer", SUPPORT)):
        model = one_answer_model(tmp_path / f"m-{name}", label)
        out = tmp_path / f"p-{name}"
        assert main(["probe", str(run_dir), "--model", str(model), "--output", str(out),
                     "--bootstrap", "0", "--batch-size", "4"]) == 0
        probes[name] = json.loads((out / "dirk.json").read_text())
        claims = [json.loads(x) for x in (out / "dirk_claims.jsonl").read_text().splitlines()]
        assert [c["knowledge_label"] for c in claims] == [label] * len(recs)
    printed = capsys.readouterr().out
    assert "warning: abstaining reference" in printed

    nei = probes["abstainer"]["knowledge_answers"]["verifier"]
    assert nei["counts"][NOT_ENOUGH_INFO] == len(recs) and nei["correct"] == 0.0
    assert probes["abstainer"]["abstaining_reference"] is True
    assert "drift toward abstaining" in probes["abstainer"]["reference_note"]
    sup = probes["believer"]["knowledge_answers"]["verifier"]
    assert sup["counts"][SUPPORT] == len(recs)
    assert sup["correct"] == pytest.approx(golds.count(SUPPORT) / len(golds))  # a second measure: the gold labels
    assert probes["believer"]["abstaining_reference"] is False and probes["believer"]["reference_note"] is None

    md = _probe_report(tmp_path, [tmp_path / "p-abstainer", tmp_path / "p-believer"], ["REAL-like", "credulous"])
    row = next(line for line in md.splitlines() if line.startswith("| claim-only answers (verifier)"))
    assert "NEI 100%" in row and "SUPPORT 100%" in row
    assert "| abstaining reference | **yes** | no |" in md
    assert "- **REAL-like**: abstaining reference" in md and "**credulous**:" not in md

    # the demo's report section reads the same probe outputs and names each variant's answers
    import shutil

    from real.demo.pipeline import VARIANTS, base_reference_dir, dirk_lines

    demo = tmp_path / "demo"
    for variant in VARIANTS:
        shutil.copytree(tmp_path / ("p-believer" if variant in ("sft", "no_ablation") else "p-abstainer"),
                        demo / "probes" / variant)
    lines = dirk_lines(demo)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ") and " | " in line}
    assert "SUPPORT 100%" in rows["sft"] and rows["sft"].endswith("| no |")
    assert "NEI 100%" in rows["real"] and rows["real"].endswith("| **yes** |")
    notes = [line for line in lines if line.startswith("- ")]
    assert [n.split(":")[0] for n in notes] == [f"- {v}" for v in VARIANTS if v not in ("sft", "no_ablation")]
    assert all("drift toward abstaining" in n for n in notes)
    assert not any("knowledge-reference base" in line and "DirK with h(K)" in line for line in lines)
    for variant in VARIANTS:  # the demo's second probe of each variant (here: any probe output will do)
        shutil.copytree(tmp_path / "p-believer", demo / "probes" / base_reference_dir(variant))
    lines = dirk_lines(demo)
    start = next(k for k, line in enumerate(lines) if line.startswith("DirK with h(K) from the base model"))
    assert lines[start + 2] == "| round | " + " | ".join(VARIANTS) + " |"
    assert any(line.startswith("| 1 | ") for line in lines[start:]) and any(
        line.startswith("| h(K) from | ") for line in lines[start:])


@pytest.mark.slow
def test_knowledge_reference_base_takes_hK_from_the_model_without_the_adapter(tiny_llama, tmp_path):
    from fae.probes.runner import load_states

    recs = make_records(4)
    records = write_jsonl(tmp_path / "eval.jsonl", recs)
    run_dir = make_run_dir(tmp_path / "run", records, recs)
    adapter = make_lora_adapter(tiny_llama, tmp_path / "adapter")  # not a probe's output: its input
    common = [str(run_dir), "--model", str(tiny_llama), "--bootstrap", "0", "--knowledge-max-new-tokens", "4"]
    assert main(["probe", *common, "--output", str(tmp_path / "plain")]) == 0
    assert main(["probe", *common, "--adapter", str(adapter), "--output", str(tmp_path / "lora")]) == 0
    assert main(["probe", *common, "--adapter", str(adapter), "--knowledge-reference", "base",
                 "--output", str(tmp_path / "mixed")]) == 0
    plain, lora, mixed = (load_states(tmp_path / d / "states.safetensors") for d in ("plain", "lora", "mixed"))
    # the same states up to rounding (another batch of prompts sums in another order on some CPUs: one float16
    # step of the stored states moved on an AVX2 EPYC)
    same = lambda a, b: np.allclose(a, b, rtol=0, atol=1e-3)  # noqa: E731 (states are stored in float16)
    assert same(mixed["hK"], plain["hK"]) and same(mixed["hr"], lora["hr"])
    assert not same(lora["hK"], plain["hK"])  # the adapter moves h(K): the option changes what DirK measures
    summary = json.loads((tmp_path / "mixed" / "dirk.json").read_text())
    assert summary["knowledge_reference"] == "base" and "parametric knowledge" in summary["knowledge_reference_model"]
    assert set(summary["knowledge_answers"]) == {"decoding", "verifier", "reference"}
    md = _probe_report(tmp_path, [tmp_path / "lora", tmp_path / "mixed"], ["verifier-hK", "base-hK"])
    assert "| h(K) from | verifier | base |" in md and "toward different states" in md
    # the base model itself under --knowledge-reference base (reproduce.sh passes it to every system): its own
    # h(K), which is the reference of its adapters' base runs, so one probe-report compares them all
    assert main(["probe", *common, "--knowledge-reference", "base", "--output", str(tmp_path / "own")]) == 0
    own = load_states(tmp_path / "own" / "states.safetensors")
    assert same(own["hK"], plain["hK"]) and same(own["hK"], mixed["hK"]) and same(own["hr"], plain["hr"])
    own_summary = json.loads((tmp_path / "own" / "dirk.json").read_text())
    assert own_summary["knowledge_reference"] == "base" and "no adapter" in own_summary["knowledge_reference_model"]
    assert set(own_summary["knowledge_answers"]) == {"decoding", "verifier"}
