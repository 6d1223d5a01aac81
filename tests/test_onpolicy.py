"""On-policy evidence ablation (SPEC §4 ``trainer: grpo``): the reward's terms, its resistance to the obvious
hacks, the policy judge's batching and cache, and a real GRPO step through ``real-train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, make_record_dict

from data_prep.prompts import format_answer
from data_prep.records import ClaimRecord
from real.training.onpolicy import (DEFAULT_REWARD_WEIGHTS, NEI, REWARD_TERMS, OnPolicyReward, PolicyJudge,
                                    Target, check_weights, score_answers, total_reward)
from real_fae_core.errors import UserError

POOL = [{"id": i, "text": f"Sentence number {i} of the document .", "doc": "D"} for i in range(6)]


def record(gold=(2,), proving=None, label="SUPPORT", rid="r1") -> ClaimRecord:
    d = make_record_dict(id=rid, label=label, sentences=POOL, evidence=[list(gold)])
    rec = ClaimRecord.from_dict(d)
    rec.extra["proving"] = list(proving or gold)
    return rec


class ReadingJudge:
    """A verifier that reads: the record's label when the pool holds every line of its proof, else NEI."""

    def __init__(self):
        self.asked = []

    def labels(self, asks):
        self.asked.extend(asks)
        return [r.label if set(r.extra["proving"]) <= set(pool) else NEI for r, pool in asks]


class ShortPoolAbstainer:
    """A verifier that abstains whenever any line of the full pool is missing (the size/hole cue)."""

    def labels(self, asks):
        return [r.label if len(pool) == len(r.sentences) else NEI for r, pool in asks]


def target(rec: ClaimRecord, pool=None, label=None, evidence=None) -> Target:
    pool = tuple(range(len(rec.sentences))) if pool is None else tuple(pool)
    ev = tuple(rec.extra["proving"]) if evidence is None else tuple(evidence)
    return Target(rec, pool, label or rec.label, ev)


def scores(judge, t: Target, *answers: str) -> list[dict]:
    got = score_answers([t] * len(answers), list(answers), judge)
    totals = total_reward(got.terms)
    return [dict({k: got.terms[k][i] for k in REWARD_TERMS}, total=totals[i]) for i in range(len(answers))]


def test_a_right_minimal_citation_earns_every_term():
    (s,) = scores(ReadingJudge(), target(record()), format_answer("SUPPORT", [2]))
    assert all(s[k] == 1.0 for k in REWARD_TERMS)
    assert s["total"] == pytest.approx(sum(DEFAULT_REWARD_WEIGHTS))


@pytest.mark.parametrize("hack, answer", [
    ("cites every line", format_answer("SUPPORT", range(6))),
    ("cites nothing", format_answer("SUPPORT", [])),
    ("always abstains", format_answer(NEI, [])),
    ("cites a line the pool does not show", '{"label": "SUPPORT", "evidence": [2, 9]}'),
    ("cites a line that proves nothing", format_answer("SUPPORT", [4])),
    ("cites the proof and more", format_answer("SUPPORT", [1, 2, 3])),
    ("right citation, wrong label", format_answer("REFUTE", [2])),
    ("prose", "The claim is supported by line 2."),
])
def test_every_hack_scores_below_a_right_minimal_citation(hack, answer):
    t = target(record())
    right, hacked = scores(ReadingJudge(), t, format_answer("SUPPORT", [2]), answer)
    assert hacked["total"] < right["total"], (hack, hacked)


def test_which_term_catches_which_hack():
    t = target(record())
    every, nothing, abstain, absent, wrong_line = scores(
        ReadingJudge(), t, format_answer("SUPPORT", range(6)), format_answer("SUPPORT", []),
        format_answer(NEI, []), '{"label": "SUPPORT", "evidence": [2, 9]}', format_answer("SUPPORT", [4]))
    # every line: necessary and sufficient, no line is left to remove as a control (it repeats necessity),
    # imprecise: below the minimal citation by precision alone
    assert every["necessity"] == every["sufficiency"] == every["control"] == 1.0
    assert every["precision"] == pytest.approx(1 / 6)
    assert every["precision"] == pytest.approx(1 / 6)
    assert nothing["label"] == 1.0 and all(nothing[k] == 0.0 for k in ("necessity", "sufficiency", "control"))
    assert abstain["format"] == 1.0 and abstain["label"] == 0.0 and abstain["total"] == 0.5
    assert absent["format"] == 0.0 and absent["total"] == 0.0
    assert wrong_line["necessity"] == 0.0 and wrong_line["sufficiency"] == 0.0 and wrong_line["control"] == 1.0


def test_the_control_denies_credit_to_a_verifier_that_abstains_on_any_shorter_pool():
    t = target(record())
    (reader,) = scores(ReadingJudge(), t, format_answer("SUPPORT", [2]))
    (cue,) = scores(ShortPoolAbstainer(), t, format_answer("SUPPORT", [2]))
    assert reader["control"] == 1.0 and cue["control"] == 0.0
    assert cue["necessity"] == 1.0  # necessity alone is fooled by the cue: the control is what tells them apart
    assert cue["total"] < reader["total"]


def test_a_short_pool_does_not_pay_for_citing_less_of_the_proof():
    # the proof is two lines and the pool holds one more: citing both leaves no room for a control (it does
    # not apply), citing one leaves room; the control must not make the shorter citation pay
    rec = record(gold=(1, 2), proving=(1, 2))
    t = Target(rec, (1, 2, 3), "SUPPORT", (1, 2))

    class EitherLine(ReadingJudge):
        def labels(self, asks):
            return [r.label if ({1, 2} & set(pool)) else NEI for r, pool in asks]

    one, both = scores(EitherLine(), t, format_answer("SUPPORT", [1]), format_answer("SUPPORT", [1, 2]))
    assert both["control"] == one["control"] == 1.0  # both's repeats its necessity: no control exists
    assert both["total"] > one["total"]


def test_half_a_duplicated_proof_is_not_necessary():
    # the proof is written twice (lines 1 and 4): citing one leaves the other, so the verdict stands
    t = target(record(gold=(4,), proving=(4,)), evidence=(1, 4))
    rec = t.record
    rec.extra["proving"] = [4]  # the reading judge needs only line 4 ...

    class EitherCopy(ReadingJudge):
        def labels(self, asks):
            return [r.label if ({1, 4} & set(pool)) else NEI for r, pool in asks]

    half, both = scores(EitherCopy(), t, format_answer("SUPPORT", [4]), format_answer("SUPPORT", [1, 4]))
    assert half["necessity"] == 0.0 and both["necessity"] == 1.0
    assert both["total"] > half["total"]


def test_an_abstention_target():
    rec = record()
    t = Target(rec, (0, 1, 3, 4, 5), NEI, ())  # the proof (line 2) is gone: NOT_ENOUGH_INFO is right
    right, cites, verdict = scores(ReadingJudge(), t, format_answer(NEI, []), '{"label": "NOT_ENOUGH_INFO", '
                                   '"evidence": [1]}', format_answer("SUPPORT", [1]))
    assert right["total"] == pytest.approx(sum(DEFAULT_REWARD_WEIGHTS))
    assert cites["label"] == 1.0 and cites["necessity"] == 0.0 and cites["total"] == 1.5
    assert verdict["label"] == 0.0 and verdict["total"] == 0.5


def test_renumbered_prompts_map_cited_numbers_back_to_record_ids():
    rec = record(gold=(4,))
    t = Target(rec, (0, 2, 4, 5), "SUPPORT", (4,))
    got = score_answers([t], [format_answer("SUPPORT", [2])], ReadingJudge(), line_ids="renumbered")
    assert got.terms["necessity"] == [1.0] and got.terms["precision"] == [1.0]  # shown number 2 = record id 4
    got = score_answers([t], [format_answer("SUPPORT", [4])], ReadingJudge(), line_ids="renumbered")
    assert got.terms["format"] == [0.0]  # no line was shown as 4 under renumbered ids


def test_the_pools_of_a_batch_are_asked_in_one_call():
    judge = ReadingJudge()
    t = target(record())
    answers = [format_answer("SUPPORT", [2])] * 4 + [format_answer(NEI, [])] * 4
    got = score_answers([t] * 8, answers, judge)
    assert got.judge_asks == 12  # necessity, sufficiency, control for each of 4 verdicts; none for NEI
    assert got.uncontrolled == 0
    assert len(judge.asked) == 12


def test_reward_weights_are_checked():
    assert check_weights(None) == DEFAULT_REWARD_WEIGHTS
    with pytest.raises(UserError, match="6 terms"):
        check_weights([1.0, 1.0])
    with pytest.raises(UserError, match=">= 0"):
        check_weights([1, 1, 1, 1, 1, -1])


def test_trl_reward_functions_are_named_and_share_one_scoring():
    rec = record()
    calls = []

    class Counting(ReadingJudge):
        def labels(self, asks):
            calls.append(len(asks))
            return super().labels(asks)

    reward = OnPolicyReward({rec.id: rec}, Counting())
    fns = reward.functions()
    assert [f.__name__ for f in fns] == list(REWARD_TERMS)
    kw = dict(prompts=["p"] * 2, completions=[[{"role": "assistant", "content": format_answer("SUPPORT", [2])}],
                                              [{"role": "assistant", "content": format_answer(NEI, [])}]],
              record_id=[rec.id] * 2, label=["SUPPORT"] * 2, evidence=[[2]] * 2, pool_ids=[list(range(6))] * 2)
    out = [f(**kw) for f in fns]
    assert out[REWARD_TERMS.index("label")] == [1.0, 0.0]
    assert calls == [3]  # the six functions of one batch score it once
    with pytest.raises(UserError, match="records file"):
        fns[0](**dict(kw, record_id=["missing"] * 2))


def test_policy_judge_is_the_argmax_of_the_label_probabilities_and_caches_per_step(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_prep.prompts import encode_chat, render_evidence_prompt
    from fae.backends.label_probs import teacher_forced_label_probs

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.train()
    rec = record()
    judge = PolicyJudge(tok, batch_size=2)
    judge.bind(model)
    judge.at_step(0)
    pools = [(rec, (0, 1, 2)), (rec, (2,)), (rec, (0, 1, 2)), (rec, ())]
    got = judge.labels(pools)
    assert model.training  # put back in train mode after the eval-mode judgement
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.eval()
    for (r, pool), label in zip(pools, got):
        ((probs, _),) = teacher_forced_label_probs(model, tok, [encode_chat(tok, render_evidence_prompt(r, pool))],
                                                    pad)
        assert label == max(probs, key=probs.get)
    assert (judge.asked, judge.pools, judge.calls) == (4, 3, 2)  # 3 distinct pools in batches of 2
    judge.labels([(rec, (2,))])
    assert judge.pools == 3  # same step: from the cache
    judge.at_step(1)
    judge.labels([(rec, (2,))])
    assert judge.pools == 4  # a new step: the policy changed, asked again


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def onpolicy_work(tmp_path_factory):
    """The demo's world and base model: a small verifier whose sampled answers parse and differ, so the
    rewards vary within a group and GRPO moves the adapter (a random tiny model's never parse)."""
    from data_prep.cli import main as real_data
    from real.demo.pipeline import BASE_DIR, DemoSize, write_world_records

    d = tmp_path_factory.mktemp("onpolicy")
    train, _ = write_world_records(d, DemoSize(n_train=24, n_test=2), seed=0)
    assert real_data(["pairs", "--records", str(train), "--variant", "no_enhancement_sufficient", "--output",
                      str(d / "pairs"), "--tokenizer", str(BASE_DIR), "--max-length", "512"]) == 0
    (d / "train.jsonl").write_text(train.read_text())
    return d


def _grpo_args(work: Path, out: Path, *extra) -> list[str]:
    from real.demo.pipeline import BASE_DIR

    return [str(Path(sys.executable).with_name("real-train")), "--config", str(REPO / "recipes/tiny/llama-grpo.yaml"),
            "--model_name_or_path", str(BASE_DIR), "--variant", "no_enhancement_sufficient", "--max_length", "512",
            "--dataset_name", str(work / "pairs"),
            "--records", str(work / "train.jsonl"), "--output_dir", str(out), *map(str, extra)]


def test_real_train_grpo_logs_every_term_and_saves_an_adapter(onpolicy_work, tmp_path):
    out = tmp_path / "grpo"
    p = subprocess.run(_grpo_args(onpolicy_work, out), cwd=REPO, env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert (out / "adapter_model.safetensors").is_file() and (out / "run_fingerprint.json").is_file()
    state = json.loads((out / "trainer_state.json").read_text())
    logged = {k for e in state["log_history"] for k in e}
    assert {f"rewards/{t}/mean" for t in REWARD_TERMS} <= logged
    assert "onpolicy/judge_pools_asked" in logged
    definition = json.loads((out / "run_fingerprint.json").read_text())["definition"]
    assert definition["trainer"] == "grpo" and definition["reward_weights"] == list(DEFAULT_REWARD_WEIGHTS)
    card = (out / "README.md").read_text()
    assert "GRPOTrainer" in card and "| reward weights | format 0.5, label 1.0, necessity 1.0" in card


def test_real_train_grpo_refuses_missing_records_in_one_line(onpolicy_work, tmp_path):
    args = _grpo_args(onpolicy_work, tmp_path / "x")
    args[args.index("--records") + 1] = str(tmp_path / "nope.jsonl")
    p = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "nope.jsonl" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.slow
def test_a_killed_grpo_run_resumes_to_the_same_adapter(onpolicy_work, tmp_path):
    """SIGKILL after a checkpoint, relaunch: the resumed run ends with the adapter of an uninterrupted one
    (the sampler's RNG state travels in the checkpoint, so the same answers are drawn after the resume)."""
    from helpers import kill_once_saved
    from safetensors.torch import load_file

    steps = ["--max_steps", "4", "--save_steps", "1", "--save_total_limit", "5"]
    whole = tmp_path / "whole"
    p = subprocess.run(_grpo_args(onpolicy_work, whole, *steps), cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    cut = tmp_path / "cut"
    kill_once_saved(_grpo_args(onpolicy_work, cut, *steps), (cut / "checkpoint-2" / "trainer_state.json").exists,
                    what="its second checkpoint", timeout=300, cwd=REPO, env=ENV)
    if (cut / "adapter_model.safetensors").exists():
        pytest.skip("the run finished before it could be killed")
    p = subprocess.run(_grpo_args(onpolicy_work, cut, *steps), cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "resuming from" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    a, b = load_file(str(whole / "adapter_model.safetensors")), load_file(str(cut / "adapter_model.safetensors"))
    first = load_file(str(whole / "checkpoint-1" / "adapter_model.safetensors"))
    assert max((a[k] - first[k]).abs().max().item() for k in a) > 1e-5  # the steps after 1 moved it
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max().item() <= 1e-6, k


@pytest.mark.slow
def test_two_ddp_processes_with_seeded_sampling_train_the_adapter_of_one(onpolicy_work, tmp_path):
    """seeded_sampling: each prompt's answers come from a seed named by (seed, step, prompt), so two gloo ranks
    draw the answers one process draws and train the same adapter, up to fp32 summation (LoRA dropout off:
    its masks come from each rank's own stream, in SFT too). Measured: relative L2 difference 3e-7; without
    seeded sampling the ranks draw other answers and the adapters differ by 2e-3 (this test then fails)."""
    from helpers import free_port
    from safetensors.torch import load_file
    import torch

    common = ["--max_steps", "3", "--save_strategy", "no", "--seeded_sampling", "true", "--global_batch_size", "8",
              "--lora_dropout", "0"]
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    outs = {}
    for n, config, per_device in ((1, "cpu.yaml", "8"), (2, "cpu_2proc.yaml", "4")):
        out = tmp_path / f"p{n}"
        train = _grpo_args(onpolicy_work, out, *common, "--per_device_train_batch_size", per_device)
        cmd = [accelerate, "launch", "--config_file", str(REPO / "accelerate_configs" / config),
               "--main_process_port", str(free_port()), "-m", "real.train", *train[1:]]
        p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0 and f"world size {n}" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
        outs[n] = load_file(str(out / "adapter_model.safetensors"))
    a, b = outs[1], outs[2]
    diff = torch.cat([(a[k] - b[k]).flatten() for k in a]).norm() / torch.cat([a[k].flatten() for k in a]).norm()
    assert diff.item() <= 1e-5
    assert max(v.abs().max().item() for v in a.values()) > 1e-3  # the adapter was trained
