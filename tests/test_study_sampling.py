"""Seeded replicates (SPEC §10): each sample a function of its unit and replicate, on every backend.

hf: a row draws from its own generator, so permuting, re-batching or mixing the prompts changes no
sample; openai: every request carries its own seed and sampling fields; vllm: one SamplingParams per row.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_server import LocalOpenAIServer

from real_fae_core.errors import UserError
from real_fae_core.hashing import derived_seed
from data_prep.records import Sentence
from fae.backends import Backend, BackendOptions, Generation, RowDecoding
from fae.backends.seeded import SeededRowSampler, draw_token
from fae.backends.vllm_backend import row_params
from fae.study.interfaces import FORMATS, render_study_prompt
from fae.study.replicates import (
    PAPER_SEEDS,
    Replicate,
    SamplingParams,
    replicate_plan,
    row_decoding,
    unit_seed,
)

PAPER = dict(temperature=0.7, top_p=0.8, top_k=20)


# --- the plan and the seeds ---------------------------------------------------------------------------------


def test_the_plan_is_greedy_then_the_papers_five_seeds():
    assert PAPER_SEEDS == (1103, 2207, 3301, 4409, 5519)
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.8, 20)
    plan = replicate_plan()
    assert [r.index for r in plan] == [0, 1, 2, 3, 4, 5]
    assert plan[0].greedy and [r.seed for r in plan[1:]] == list(PAPER_SEEDS)
    assert replicate_plan(SamplingParams(seeds=())) == (Replicate(0, None),)
    with pytest.raises(ValueError, match="its own"):
        SamplingParams(seeds=(1, 1))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_a_units_seed_names_dataset_claim_document_and_replicate_only():
    seed = unit_seed("scifact", "scifact-13", "14717500", 1103)
    assert seed == derived_seed("scifact", "scifact-13", "14717500", 1103) and 0 <= seed < 2**31
    others = {unit_seed("fever", "scifact-13", "14717500", 1103), unit_seed("scifact", "scifact-14", "14717500", 1103),
              unit_seed("scifact", "scifact-13", "4983", 1103), unit_seed("scifact", "scifact-13", "14717500", 2207)}
    assert seed not in others and len(others) == 4
    assert unit_seed("fever", "c", None, 1103) == unit_seed("fever", "c", "", 1103)


def test_row_decodings_follow_the_plan_and_carry_the_papers_settings():
    rows = [row_decoding("fever", "fever-1", None, r) for r in replicate_plan()]
    assert rows[0] == RowDecoding(max_new_tokens=16) and rows[0].greedy
    assert [r.seed for r in rows[1:]] == [unit_seed("fever", "fever-1", None, s) for s in PAPER_SEEDS]
    assert all((r.temperature, r.top_p, r.top_k, r.max_new_tokens) == (0.7, 0.8, 20, 16) for r in rows[1:])
    # a replicate is named by its seed: dropping one leaves the others' seeds as they were
    fewer = [row_decoding("fever", "fever-1", None, r) for r in replicate_plan(SamplingParams(seeds=PAPER_SEEDS[1:]))]
    assert [r.seed for r in fewer[1:]] == [r.seed for r in rows[2:]]


def test_row_decoding_ranges():
    for bad in (dict(seed=-1), dict(seed=True), dict(seed=1.5), dict(seed=1, temperature=0), dict(top_p=1.5),
                dict(top_k=-1), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            RowDecoding(**bad)
    assert RowDecoding(seed=3, **PAPER).settings(16) == {"greedy": False, "seed": 3, "temperature": 0.7,
                                                         "top_p": 0.8, "top_k": 20, "max_new_tokens": 16}


# --- the per-row sampler, without a model -------------------------------------------------------------------


def _generator(seed):
    import torch

    return torch.Generator().manual_seed(seed)


def test_draws_respect_top_k_top_p_and_the_temperature():
    import torch

    logits = torch.tensor([0.0, 3.0, 2.5, -1.0, 2.9, 1.0])
    top2 = {draw_token(logits, RowDecoding(seed=0, top_k=2), _generator(s)) for s in range(300)}
    assert top2 == {1, 4}
    nucleus = {draw_token(logits, RowDecoding(seed=0, top_p=0.05), _generator(s)) for s in range(100)}
    assert nucleus == {1}
    counts = [0] * 6
    gen = _generator(7)
    for _ in range(4000):
        counts[draw_token(logits, RowDecoding(seed=0, temperature=2.0), gen)] += 1
    expected = torch.softmax(logits / 2.0, dim=0).tolist()
    assert all(abs(c / 4000 - p) < 0.03 for c, p in zip(counts, expected)), (counts, expected)
    masked = torch.tensor([float("-inf"), 1.0, float("-inf"), 0.5])  # a grammar's mask is kept
    assert {draw_token(masked, RowDecoding(seed=0), _generator(s)) for s in range(100)} == {1, 3}


def _draw_by_full_sort(logits, decoding, generator):
    """The reference draw: the whole vocabulary sorted (stable), cut to top-k, then top-p and the draw."""
    import torch

    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    values, order = torch.sort(logits.double() / decoding.temperature, descending=True, stable=True)
    values, order = values[:decoding.top_k], order[:decoding.top_k]
    probs = torch.softmax(values, dim=0)
    before = torch.cumsum(probs, dim=0) - probs
    probs = torch.where(before < decoding.top_p, probs, torch.zeros_like(probs))
    cum = torch.cumsum(probs, dim=0)
    pick = int(torch.searchsorted(cum, (u * cum[-1]).reshape(1), right=True))
    return int(order[min(pick, int(torch.nonzero(probs).max()))])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=2, max_size=40), st.integers(1, 45), st.integers(0, 2**31),
       st.sampled_from([0.8, 1.0]))
def test_top_k_by_candidates_draws_what_the_full_sort_draws(values, k, seed, top_p):
    """Sorting only the logits at or above the k-th value keeps the full sort's top-k, ties included."""
    import torch

    logits = torch.tensor(values, dtype=torch.float32) * 0.5  # many ties
    decoding = RowDecoding(seed=0, temperature=0.7, top_p=top_p, top_k=k)
    assert draw_token(logits, decoding, _generator(seed)) == _draw_by_full_sort(logits, decoding, _generator(seed))


def test_a_rows_draws_do_not_depend_on_its_batch_and_greedy_rows_are_untouched():
    import torch

    torch.manual_seed(0)
    vocab = 50
    logits = {name: torch.randn(vocab) for name in "abcde"}
    seeds = {"a": 11, "b": 12, "c": 13, "d": 14, "e": None}

    def run(names, steps=6):
        decodings = [RowDecoding(seed=seeds[n], **PAPER) if seeds[n] is not None else RowDecoding() for n in names]
        sampler = SeededRowSampler(decodings)
        picked = {n: [] for n in names}
        for _ in range(steps):
            scores = torch.stack([logits[n] for n in names])
            out = sampler(None, scores.clone())
            for row, n in enumerate(names):
                if seeds[n] is None:
                    assert torch.equal(out[row], scores[row])
                else:
                    assert torch.isfinite(out[row]).sum() == 1
                picked[n].append(int(out[row].argmax()))
        return picked

    together = run(list("abcde"))
    assert run(list("dbeac")) == {n: together[n] for n in "dbeac"}
    assert all(run([n]) == {n: together[n]} for n in "abcd")
    assert len({tuple(together[n]) for n in "abcd"}) == 4


# --- hf: a tiny model ---------------------------------------------------------------------------------------


def _units(k):
    words = ["vaccine", "trial", "virus", "mask", "study", "dose", "risk", "cohort"]
    return [Sentence(i, f"The {words[(i + k) % 8]} result {i} was consistent across trials.", "d")
            for i in range(2 + k % 3)]


@pytest.fixture(scope="module")
def hf_backend(noisy_llama):
    from fae.backends.hf import HFBackend

    return HFBackend({"model": str(noisy_llama), "dtype": "fp32", "device": "cpu", "batch_size": 4,
                      "max_new_tokens": 16, "label_probs": False})


def _study_rows(n):
    """``n`` prompts (claims, pools and formats differ, so lengths differ) with their sampled decodings."""
    prompts, decodings = [], []
    for k in range(n):
        fmt = FORMATS["codes" if k % 2 else "labels"]
        prompts.append(render_study_prompt(f"Claim number {k} about the vaccine.", _units(k), fmt, "fever"))
        decodings.append(row_decoding("fever", f"fever-{k}", None, replicate_plan()[1 + k % 5]))
    return prompts, decodings


def _texts(backend, prompts, decodings, batch_size):
    backend.batch_size = batch_size
    try:
        return [g.text for g in backend.generate_rows(prompts, decodings)]
    finally:
        backend.batch_size = 4


def test_hf_samples_do_not_depend_on_batch_size_order_or_neighbours(hf_backend):
    prompts, decodings = _study_rows(6)
    base = _texts(hf_backend, prompts, decodings, 4)
    assert _texts(hf_backend, prompts, decodings, 1) == base
    order = list(range(6))
    random.Random(3).shuffle(order)
    permuted = _texts(hf_backend, [prompts[i] for i in order], [decodings[i] for i in order], 4)
    assert permuted == [base[i] for i in order]
    # neighbours: other sampled rows (other seeds) and greedy rows in the same batches, the originals in between
    more, more_dec = _study_rows(9)
    mixed_prompts = [p for pair in zip(prompts, more[6:] * 2) for p in pair]
    mixed_dec = [d for pair in zip(decodings, [RowDecoding(seed=99, **PAPER), RowDecoding(max_new_tokens=16),
                                               more_dec[8]] * 2) for d in pair]
    assert _texts(hf_backend, mixed_prompts, mixed_dec, 4)[::2] == base


def test_hf_seeds_matter_and_greedy_rows_are_the_greedy_answers(hf_backend):
    prompts, _ = _study_rows(3)
    one = prompts[0]
    seeded = [RowDecoding(seed=s, **PAPER, max_new_tokens=16) for s in range(6)]
    texts = _texts(hf_backend, [one] * 6, seeded, 4)
    assert len(set(texts)) > 1, texts  # different seeds, different samples
    assert _texts(hf_backend, [one] * 2, [seeded[2]] * 2, 4) == [texts[2]] * 2  # the same seed twice: the same
    greedy = hf_backend.generate(prompts)
    rows = hf_backend.generate_rows(prompts + [one], [RowDecoding(max_new_tokens=16)] * 3 + [seeded[0]])
    assert [g.text for g in rows[:3]] == [g.text for g in greedy]
    assert [g.finish_reason for g in rows[:3]] == [g.finish_reason for g in greedy]
    assert rows[0].decoding == {"greedy": True, "max_new_tokens": 16} and rows[3].decoding["seed"] == 0
    assert greedy[0].decoding is None


def test_hf_rows_keep_their_own_answer_cap(hf_backend):
    prompts, _ = _study_rows(2)
    rows = hf_backend.generate_rows(prompts, [RowDecoding(max_new_tokens=2), RowDecoding(seed=5, max_new_tokens=3)])
    assert rows[0].decoding["max_new_tokens"] == 2 and rows[1].decoding["max_new_tokens"] == 3
    tok = hf_backend.tok
    assert len(tok(rows[0].text, add_special_tokens=False)["input_ids"]) <= 2
    with pytest.raises(ValueError, match="2 prompts but 1 decodings"):
        hf_backend.generate_rows(prompts, [RowDecoding()])


def _unit_grid(k):
    """One unit's study prompts: two budgets (the shorter's evidence a prefix of the longer's) x two
    formats x greedy + five seeds, as `fae study` asks them."""
    prompts, decodings = [], []
    units = _units(k) + [Sentence(10 + i, s.text, "d") for i, s in enumerate(_units(k + 1))]
    for budget in (2, len(units)):
        for fmt in ("codes", "labels"):
            for rep in replicate_plan():
                prompts.append(render_study_prompt(f"Claim {k} about the vaccine.", units[:budget], FORMATS[fmt],
                                                   "fever"))
                decodings.append(row_decoding("fever", f"fever-{k}", None, rep))
    return prompts, decodings


def test_hf_shared_prefixes_are_read_once_and_answer_as_one_prompt_at_a_time(hf_backend):
    """The prefix tree reads each shared prefix once, and every row answers as if asked alone."""
    from data_prep.prompts import encode_chat
    from fae.backends.hf import generate_batched, greedy_config
    from fae.backends.prefix_tree import generate_shared

    prompts, decodings = [], []
    for k in (0, 1):
        p, d = _unit_grid(k)
        prompts, decodings = prompts + p, decodings + d
    lm, tok = hf_backend.lm, hf_backend.tok
    ids = [encode_chat(tok, m) for m in prompts]
    alone = [generate_batched(lm, tok, [x], greedy_config(lm, tok, 16), 1, sampling=[d])[0]
             for x, d in zip(ids, decodings)]
    shared, counts = generate_shared(lm, tok, ids, decodings, lambda cap: greedy_config(lm, tok, cap), 16)
    assert [g.text for g in shared] == [g.text for g in alone]
    assert [g.finish_reason for g in shared] == [g.finish_reason for g in alone]
    assert len({g.text for g in shared}) > 4  # the seeds drew different answers
    assert counts["leaves"] == 8 == len({tuple(x) for x in ids})  # 2 units x 2 budgets x 2 formats
    assert counts["decode_calls"] == 1  # 48 rows of 8 prompts decoded together, the caches left-padded
    assert counts["prompt_tokens"] == sum(map(len, ids))
    distinct = {tuple(x) for x in ids}
    trie_nodes = {x[:n] for x in distinct for n in range(1, len(x) + 1)}  # every distinct prefix, once
    assert counts["prefill_tokens"] == len(trie_nodes) < counts["prompt_tokens"] / 6
    # through the backend: the same answers, and the study's stats count what was read
    rows = hf_backend.generate_rows(prompts, decodings)
    assert [g.text for g in rows] == [g.text for g in alone]


def test_sibling_edges_share_a_forward_pass_only_when_alike_in_length():
    """A short format instruction is not padded to the length of the evidence beside it."""
    from fae.backends.prefix_tree import Leaf, sibling_groups

    def part(first, n):  # one branch: a leaf whose edge after the 2 shared tokens is n tokens (+ its last)
        return [Leaf((7, 7, first) + (1,) * (n - 1) + (9,), 4)]

    parts = [part(10, 3), part(11, 40), part(12, 25), part(13, 2), part(14, 20)]
    groups = sibling_groups(parts, 2)
    assert [[p[0].ids[2] for p in g] for g in groups] == [[11, 12, 14], [10, 13]]
    assert sibling_groups([part(10, 5), part(11, 5)], 2) == [[part(10, 5), part(11, 5)]]


@pytest.fixture(scope="module")
def sliding_qwen(tiny_qwen, tmp_path_factory):
    """The tiny Qwen2 with a sliding window of 16 on its second layer (weights x5, so answers vary)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_qwen)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 16, 1
    config.layer_types = ["full_attention", "sliding_attention"]
    lm = AutoModelForCausalLM.from_pretrained(tiny_qwen, config=config)
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(5.0)
    out = tmp_path_factory.mktemp("sliding-qwen")
    lm.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_qwen).save_pretrained(out)
    return out


def test_a_sliding_window_cache_is_never_padded_and_answers_as_one_prompt_at_a_time(sliding_qwen):
    """A sliding-window layer drops positions by its own rule: its leaves are decoded alone, unpadded."""
    from data_prep.prompts import encode_chat
    from fae.backends.hf import generate_batched, greedy_config, load_hf_model
    from fae.backends.prefix_tree import generate_shared

    lm, tok = load_hf_model(sliding_qwen, None, "fp32", "cpu")
    assert lm.config.layer_types == ["full_attention", "sliding_attention"]
    prompts, decodings = _unit_grid(0)
    ids = [encode_chat(tok, m) for m in prompts]
    assert min(map(len, ids)) > 16  # every prompt is longer than the window
    alone = [generate_batched(lm, tok, [x], greedy_config(lm, tok, 16), 1, sampling=[d])[0].text
             for x, d in zip(ids, decodings)]
    shared, counts = generate_shared(lm, tok, ids, decodings, lambda cap: greedy_config(lm, tok, cap), 16)
    assert [g.text for g in shared] == alone
    assert counts["decode_calls"] == counts["leaves"] == 4  # one call per distinct prompt: no padding


# --- openai: the local test server --------------------------------------------------------------------------

SENT = ("seed", "temperature", "top_p", "top_k", "max_tokens", "logprobs")


def _echo(body):
    """A server that answers with the decoding fields its request carried."""
    return json.dumps({k: body.get(k) for k in SENT})


def _openai(url, **extra):
    from fae.backends.openai_backend import OpenAIBackend

    return OpenAIBackend({"model": "verifier", "base_url": url, "request_timeout": 5, "max_retries": 2,
                          "backoff_base": 0.01, "concurrency": 4, **extra})


def test_openai_sends_each_rows_seed_and_sampling_fields_and_records_them():
    prompts, decodings = _study_rows(5)
    decodings[1] = RowDecoding(max_new_tokens=16)
    with LocalOpenAIServer(responder=_echo) as srv:
        answers = _openai(srv.base_url).generate_rows(prompts, decodings)
    for answer, d in zip(answers, decodings):
        got = json.loads(answer.text)
        if d.greedy:
            assert got == {**dict.fromkeys(SENT), "temperature": 0.0, "max_tokens": 16}
            assert answer.decoding == {"temperature": 0.0, "max_tokens": 16}
        else:
            want = {"seed": d.seed, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 16}
            assert got == {**want, "logprobs": None}
            assert answer.decoding == want


def test_openai_a_server_refusing_top_k_is_asked_without_it_and_the_record_says_so():
    prompts, decodings = _study_rows(3)
    with LocalOpenAIServer(responder=_echo, faults=lambda body, attempt: "400" if "top_k" in body else None) as srv:
        backend = _openai(srv.base_url, concurrency=1)
        answers = backend.generate_rows(prompts, decodings)
        assert srv.count(outcome="400") == 1  # refused once: the requests queued meanwhile are sent without it
    for answer, d in zip(answers, decodings):
        assert json.loads(answer.text)["top_k"] is None and json.loads(answer.text)["seed"] == d.seed
        assert "top_k" not in answer.decoding and answer.decoding["seed"] == d.seed
    assert "top_k" in backend.stats["top_k_skipped"]


def test_openai_plain_generate_is_unchanged():
    prompts, _ = _study_rows(2)
    with LocalOpenAIServer(responder=_echo) as srv:
        answers = _openai(srv.base_url, label_probs=False).generate(prompts)
    assert [json.loads(a.text) for a in answers] == [{**dict.fromkeys(SENT), "temperature": 0.0,
                                                      "max_tokens": 64}] * 2
    assert all(a.decoding is None for a in answers)


# --- vllm and third-party backends --------------------------------------------------------------------------


def test_vllm_gets_one_sampling_params_per_row():
    stand_in = dict  # vllm.SamplingParams takes these keywords
    sampled = row_params(stand_in, RowDecoding(seed=42, **PAPER), 64, [7, 8])
    assert sampled == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "seed": 42, "max_tokens": 64,
                       "stop_token_ids": [7, 8]}
    assert row_params(stand_in, RowDecoding(seed=1), 64, None)["top_k"] == -1  # off, in every vLLM release
    assert row_params(stand_in, RowDecoding(max_new_tokens=16), 64, [7]) == {
        "temperature": 0.0, "max_tokens": 16, "stop_token_ids": [7]}


class _Echo(Backend):
    options_class = BackendOptions

    def generate(self, prompts, callback=None):
        return [Generation("x", "stop") for _ in prompts]


def test_a_backend_without_per_row_sampling_answers_greedy_rows_and_refuses_samples():
    backend = _Echo({"model": "m"})
    assert backend.generate_rows([[]], [RowDecoding()]) == [Generation("x", "stop")]
    with pytest.raises(UserError, match="cannot decode each prompt its own way"):
        backend.generate_rows([[]], [RowDecoding(seed=1)])
    with pytest.raises(UserError):
        backend.generate_rows([[]], [RowDecoding(max_new_tokens=16)])
