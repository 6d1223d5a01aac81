"""REAL training: recipes, completion-only labels, real `accelerate launch` runs, resume, merge."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import REPO, CpuBurner, alive, free_port, kill_once_saved, tagged_processes, toy_training_records

from data_prep.cli import main as real_data
from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock
from data_prep.prompts import render_chat
from real import training as rt
from real.train import main as real_train

os.environ["HF_HUB_OFFLINE"] = "1"
# Training recipes: every YAML under recipes/ except the non-training ones
# (annotator lists for `real-data enhance`, eval configs for `fae run`).
NON_TRAINING = {"annotators", "eval"}
RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml")
                 if p.relative_to(REPO / "recipes").parts[0] not in NON_TRAINING)
CPU_RECIPE_DIRS = {"tiny", "demo", "smollm2-135m-instruct", "study"}
GPU_RECIPES = [p for p in RECIPES if p.parent.name not in CPU_RECIPE_DIRS]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
REAL_TRAIN = str(Path(sys.executable).with_name("real-train"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
EOT = {"llama": "<|eot_id|>", "qwen2": "<|im_end|>"}


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_llama, tiny_qwen):
    """Records and pairs datasets shared by every test of this module."""
    d = tmp_path_factory.mktemp("train")
    recs = d / "train.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in toy_training_records()))
    for variant, tok in (("real", tiny_llama), ("sft", tiny_qwen)):
        assert real_data(["pairs", "--records", str(recs), "--variant", variant, "--output",
                          str(d / f"pairs-{variant}"), "--tokenizer", str(tok)]) == 0
    return d


def _args(recipe: str, model, data, out, *extra) -> list[str]:
    return ["--config", str(REPO / "recipes" / "tiny" / recipe), "--model_name_or_path", str(model),
            "--dataset_name", str(data), "--output_dir", str(out), *map(str, extra)]


def _run(cmd, timeout=300) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


# ---------------------------------------------------------------------------
# Recipes and argument parsing
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_every_recipe_parses_with_installed_trl(recipe):
    raw = yaml.safe_load(recipe.read_text())
    from real.training.args import native_bf16_cpu_flags

    # cpu_bf16 recipes are refused on a CPU without native bf16 (the recipe says: pass --cpu_bf16 false)
    off = ["--cpu_bf16", "false"] if raw.get("cpu_bf16") and not native_bf16_cpu_flags() else []
    script, training, model = rt.parse_args(["--config", str(recipe), *off])
    assert script.variant in rt.VARIANT_NAMES and script.variant in str(raw["dataset_name"]).split("/")[-1]
    # paper hyper-parameters (SPEC §4)
    assert model.use_peft and (model.lora_r, model.lora_alpha, model.lora_dropout) == (16, 32, 0.05)
    if recipe.parent.name == "study":
        # format tuning of the study's models (recipes/study/format_tune.sh): one recipe for SmolLM2 (30 layers)
        # and Gemma 3 270M (18), every projection of every layer, a few hundred steps, pairs with NEI targets
        target = re.compile(model.lora_target_modules)
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.17.mlp.gate_proj", "model.layers.29.mlp.down_proj"):
            assert target.fullmatch(name), name
        assert not any(target.fullmatch(n) for n in ("lm_head", "model.embed_tokens", "model.layers.3.input_layernorm"))
        assert script.variant == "no_enhancement" and 100 <= training.max_steps <= 1000
        assert training.max_length == 1024 and raw["cpu_bf16"] is True and training.learning_rate == 5e-4
        return
    if recipe.parent.name == "smollm2-135m-instruct":
        # the CPU budget's choices, each stated in the recipe (recipes/smollm2-135m-instruct/README.md):
        # every projection of the top 10 of 30 layers, bf16 autocast, one epoch at a higher learning rate
        target = re.compile(model.lora_target_modules)
        assert target.fullmatch("model.layers.20.mlp.down_proj") and target.fullmatch("model.layers.29.self_attn.q_proj")
        assert not target.fullmatch("model.layers.19.self_attn.q_proj")
        assert raw["cpu_bf16"] is True
        assert training.max_steps == -1 and training.num_train_epochs == 1 and training.learning_rate == 5e-4
        assert training.save_steps == 25 and training.seed == raw["seed"]
        return
    assert sorted(model.lora_target_modules) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert str(training.optim.value).startswith("adamw") and training.seed == raw["seed"]
    if raw.get("trainer") == "grpo":  # on-policy (SPEC §4): GRPOConfig's options, the reward's weights
        from real.training.onpolicy import REWARD_TERMS

        assert type(training).__name__ == "RealGRPOConfig" and script.trainer == "grpo" and script.records
        assert len(training.reward_weights) == len(REWARD_TERMS) and training.num_generations >= 2
        assert training.max_completion_length >= 16
        return
    if recipe.parent.name == "demo":
        # the toy demo base has 512 positions and documents its learning rate (recipes/demo/README.md)
        assert training.learning_rate == 3e-3 and training.max_length == 512
    else:
        assert training.learning_rate == 1e-4 and training.max_length == 4096
    if recipe in GPU_RECIPES:
        assert raw["bf16"] is True and raw["dtype"] == "bfloat16"
        assert training.num_train_epochs == 2 and training.global_batch_size == 32
        assert raw["per_device_train_batch_size"] * raw["gradient_accumulation_steps"] == 32
    if not rt.accelerator_available():
        assert training.bf16 is False and training.use_cpu is True  # forced off on CPU


def test_each_model_folder_has_a_readme_with_launch_lines():
    for folder in {p.parent for p in GPU_RECIPES}:
        text = (folder / "README.md").read_text()
        for recipe in folder.glob("*.yaml"):
            assert f"--config recipes/{folder.name}/{recipe.name}" in text
        for n in (1, 4, 8):
            assert re.search(rf"\|\s*{n}\s*\|", text), f"{folder}: no batch row for {n} GPUs"


def test_precedence_defaults_yaml_cli():
    recipe = str(REPO / "recipes" / "tiny" / "llama-sft.yaml")
    _, t, m = rt.parse_args(["--config", recipe])
    assert t.learning_rate == 1e-4 and m.lora_r == 16  # YAML over TRL's defaults (2e-5 / 16)
    assert t.weight_decay == 0.0  # untouched default
    _, t, m = rt.parse_args(["--config", recipe, "--learning_rate", "3e-4", "--lora_r", "8"])
    assert t.learning_rate == 3e-4 and m.lora_r == 8  # CLI over YAML


def test_global_batch_size_derives_accumulation():
    assert rt.derive_accumulation(32, 4, 1) == 8
    assert rt.derive_accumulation(32, 4, 4) == 2
    assert rt.derive_accumulation(32, 4, 8) == 1
    with pytest.raises(UserError, match="not a multiple"):
        rt.derive_accumulation(32, 3, 2)


def _main_err(argv, capsys) -> str:
    assert real_train(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("real-train: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_unknown_recipe_key_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "recipes/tiny/llama-sft.yaml").read_text() + "lora_alfa: 8\n")
    err = _main_err(["--config", str(bad)], capsys)
    assert "lora_alfa: unknown key" in err and "did you mean 'lora_alpha'" in err and "bad.yaml" in err


def test_missing_base_model_is_one_sentence(work, tmp_path, capsys):
    err = _main_err(_args("llama-real.yaml", tmp_path / "no-such-model", work / "pairs-real", tmp_path / "o"), capsys)
    assert "base model path" in err and "no-such-model" in err and "does not exist" in err


def test_bad_data_is_one_sentence(work, tiny_llama, tmp_path, capsys):
    err = _main_err(_args("llama-real.yaml", tiny_llama, tmp_path / "missing", tmp_path / "o"), capsys)
    assert "does not exist" in err and "real-data pairs" in err
    err = _main_err(_args("llama-real.yaml", tiny_llama, work / "pairs-sft", tmp_path / "o"), capsys)
    assert "built for variant sft" in err and "'real'" in err


# ---------------------------------------------------------------------------
# The loss covers exactly the answer (labels built by TRL from our pairs)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_labels_cover_exactly_the_answer(arch, work, tiny_llama, tiny_qwen, tmp_path):
    from datasets import load_from_disk

    model = tiny_llama if arch == "llama" else tiny_qwen
    data = work / ("pairs-real" if arch == "llama" else "pairs-sft")
    recipe = "llama-real.yaml" if arch == "llama" else "qwen-sft.yaml"
    run = rt.build_trainer(*rt.parse_args(_args(recipe, model, data, tmp_path / "o")))
    tok = run.tokenizer
    rows = load_from_disk(str(data))["train"]
    processed = run.trainer.train_dataset
    assert len(processed) == len(rows)
    kinds = set()
    for row, ex in zip(rows, processed):
        ids, labels = ex["input_ids"], ex["labels"]
        start = next(i for i, lab in enumerate(labels) if lab != -100)
        assert all(lab == -100 for lab in labels[:start])
        assert labels[start:] == ids[start:]  # contiguous up to the end
        # everything before the loss is the inference-time prompt, generation header included
        assert tok.decode(ids[:start]) == render_chat(tok, row["prompt"])
        target = tok.decode(labels[start:])
        answer = row["completion"][0]["content"]
        assert target.rstrip("\n") == answer + EOT[arch]
        assert json.loads(answer) == {"label": row["label"], "evidence": row["evidence"]}
        kinds.add(row["kind"])
    assert kinds == ({"positive", "negative"} if arch == "llama" else {"positive"})
    # generation stops at the end-of-turn token
    assert tok.convert_tokens_to_ids(EOT[arch]) in run.model.generation_config.eos_token_id


def test_cpu_training_step_projects_only_the_labelled_positions_with_the_same_loss(work, tiny_llama, tmp_path,
                                                                                     monkeypatch):
    """A real step through build_trainer: cpu_scored_positions=labelled (the default) projects fewer
    positions onto the vocabulary than TRL's `all`, and the step's loss and LoRA update are the same."""
    import torch
    import trl.trainer.utils as trl_utils
    from real.training import cpu_loss

    original = trl_utils._ChunkedLogProbFunction.apply
    rows: list[int] = []

    def apply(hidden, *args):
        rows.append(hidden.reshape(-1, hidden.shape[-1]).shape[0])
        return original(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", apply)
    results = {}
    try:
        for mode in ("all", "labelled"):
            rows.clear()
            extra = ["--max_steps", "1", "--save_strategy", "no", "--logging_steps", "1"]
            if mode == "all":
                extra += ["--cpu_scored_positions", "all"]
            run = rt.build_trainer(*rt.parse_args(_args("llama-real.yaml", tiny_llama, work / "pairs-real",
                                                        tmp_path / mode, *extra)))
            out = run.trainer.train()
            lora = {n: p.detach().clone() for n, p in run.model.named_parameters() if "lora_B" in n}
            results[mode] = (out.training_loss, list(rows), lora)
    finally:
        cpu_loss.score_positions("all")
    (loss_all, rows_all, lora_all), (loss_lab, rows_lab, lora_lab) = results["all"], results["labelled"]
    assert rows_all and rows_lab and sum(rows_lab) < sum(rows_all) / 2
    assert loss_lab == pytest.approx(loss_all, rel=1e-5)
    assert lora_all.keys() == lora_lab.keys() and lora_all
    for name, value in lora_all.items():
        assert float(value.abs().sum()) > 0  # the step moved lora_B away from its zero init
        torch.testing.assert_close(lora_lab[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_padding_free_trains_the_padded_batch_without_its_padding(work, tiny_llama, tmp_path):
    """padding_free: true (TRL packs a batch into one row with position ids) runs through real.train although
    TRL refuses it with max_length set: the pairs were checked against max_length first, so TRL's truncation
    is off while it prepares them and max_length is back afterwards. The step's loss and LoRA update are the
    padded batch's; the model saw one row and no pad token."""
    import torch

    results = {}
    for padding_free in (False, True):
        # no LoRA dropout (its masks follow the batch's shape) and plain SGD (Adam's first step is lr * sign(g),
        # which turns a float rounding of a near-zero gradient into a full step): the update is the gradient
        extra = ["--max_steps", "1", "--save_strategy", "no", "--logging_steps", "1", "--per_device_train_batch_size",
                 "4", "--lora_dropout", "0", "--optim", "sgd", "--learning_rate", "1.0", "--warmup_steps", "0",
                 "--padding_free", str(padding_free).lower()]
        run = rt.build_trainer(*rt.parse_args(_args("llama-real.yaml", tiny_llama, work / "pairs-real",
                                                    tmp_path / str(padding_free), *extra)))
        assert run.trainer.args.max_length == 4096  # put back after SFTTrainer prepared the data
        shapes: list[tuple[int, int]] = []
        handle = run.model.register_forward_pre_hook(
            lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        out = run.trainer.train()
        handle.remove()
        lora = {n: p.detach().clone() for n, p in run.model.named_parameters() if "lora_B" in n}
        results[padding_free] = (out.training_loss, shapes, lora)
    (loss_pad, shapes_pad, lora_pad), (loss_free, shapes_free, lora_free) = results[False], results[True]
    assert shapes_pad and shapes_pad[0][0] == 4  # four padded rows
    assert shapes_free and shapes_free[0][0] == 1  # one packed row
    assert shapes_free[0][1] < shapes_pad[0][0] * shapes_pad[0][1]  # the padding is gone
    assert loss_free == pytest.approx(loss_pad, rel=1e-4)
    assert lora_pad.keys() == lora_free.keys() and lora_pad
    for name, value in lora_pad.items():
        assert float(value.abs().sum()) > 0
        torch.testing.assert_close(lora_free[name], value, rtol=1e-3, atol=1e-6, msg=name)


def test_generation_eos_gets_end_of_turn_token(tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    model.generation_config.eos_token_id = None
    tok.eos_token = "<|end_of_text|>"  # as in the base (non-instruct) Llama-3.1 tokenizer
    eos = rt.set_generation_eos(model, tok)
    assert eos == model.generation_config.eos_token_id
    assert tok.convert_tokens_to_ids("<|eot_id|>") in eos  # found in the chat template
    assert tok.convert_tokens_to_ids("<|end_of_text|>") in eos


def test_pad_token_is_set_when_missing(tiny_qwen):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    tok.pad_token = None
    assert rt.ensure_pad_token(tok) == "<|endoftext|>" != tok.eos_token


# ---------------------------------------------------------------------------
# Real launches
# ---------------------------------------------------------------------------

def _logits(model, tok):
    import torch

    ids = tok("Claim: The vaccine reduces the risk of severe disease.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.slow
def test_accelerate_cpu_trains_saves_and_reloads(work, tiny_llama, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from real.merge import main as real_merge

    out = tmp_path / "llama-real"
    p = _run([ACCELERATE, "launch", "--config_file", "accelerate_configs/cpu.yaml", "-m", "real.train",
              *_args("llama-real.yaml", tiny_llama, work / "pairs-real", out, "--learning_rate", "1e-3")])
    assert "world size 1" in p.stdout
    for f in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "chat_template.jinja",
              "generation_config.json", "train_results.json", "trainer_state.json", "resolved_config.yaml",
              "README.md"):
        assert (out / f).is_file(), f

    results = json.loads((out / "train_results.json").read_text())
    assert results["world_size"] == 1 and results["global_batch_size"] == 2
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8

    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert resolved["learning_rate"] == 1e-3  # CLI beat YAML
    assert resolved["lora_r"] == 16 and resolved["variant"] == "real" and resolved["bf16"] is False
    assert resolved["eos_token"] is None and resolved["pad_token"] is None  # not to_dict()'s "<EOS_TOKEN>" mask
    reparsed = rt.parse_args(["--config", str(out / "resolved_config.yaml")])
    assert reparsed[1].learning_rate == 1e-3 and reparsed[1].eos_token is None and reparsed[2].lora_r == 16

    card = (out / "README.md").read_text()
    for needle in (f"base_model: {tiny_llama}", "variant", "real", str(work / "pairs-real"), "sha256",
                   "r=16, alpha=32, dropout=0.05", "| learning rate | 0.001 |", "| global batch | 2 |"):
        assert needle in card, needle

    tok = AutoTokenizer.from_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|eot_id|>") in gen["eos_token_id"]

    base = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    base_logits = _logits(base, tok)
    tuned = PeftModel.from_pretrained(base, str(out)).eval()
    tuned_logits = _logits(tuned, tok)
    assert (tuned_logits - base_logits).abs().max() > 1e-4  # the adapter was trained and saved
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama), str(out / "checkpoint-8"))
    torch.testing.assert_close(_logits(again.eval(), tok), tuned_logits)  # = the trainer's last state

    merged_dir = tmp_path / "merged"
    assert real_merge(["--adapter", str(out), "--output", str(merged_dir)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    torch.testing.assert_close(_logits(merged, tok), tuned_logits, atol=1e-5, rtol=1e-4)
    assert merged.generation_config.eos_token_id == gen["eos_token_id"]
    assert not any(n.endswith("lora_A.weight") for n, _ in merged.named_parameters())


def _launch_2proc(out: Path, tiny_llama, work, tag: str, *extra) -> list[str]:
    """`accelerate launch` of real.train on two CPU processes (gloo); every process carries ``tag``."""
    return [ACCELERATE, "launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
            "--main_process_port", str(free_port()), "-m", "real.train",
            *_args("llama-real.yaml", tiny_llama, work / "pairs-real", out, *extra)]


def _left_after(tag: str, seconds: float, pids=()) -> list[int]:
    """Processes tagged ``tag`` or among ``pids`` still alive after up to ``seconds``."""
    deadline = time.time() + seconds
    while (left := sorted({*tagged_processes(tag), *filter(alive, pids)})) and time.time() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds left-over processes through /proc")
def test_cpu_2proc_really_runs_two_processes_on_a_busy_machine(work, tiny_llama, tmp_path):
    """Two gloo ranks train while every core is kept busy; they finish, and no process of the run is left."""
    out, tag = tmp_path / "ddp", uuid.uuid4().hex
    cmd = _launch_2proc(out, tiny_llama, work, tag, "--max_steps", "2", "--per_device_train_batch_size", "1",
                        "--global_batch_size", "4", "--save_strategy", "no")
    with CpuBurner(seconds=600):  # bounded; stopped as soon as the run returns
        p = subprocess.run(cmd, cwd=REPO, env={**ENV, "REAL_TEST_TAG": tag}, capture_output=True, text=True,
                           timeout=600)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    assert "world size 2" in p.stdout
    for rank in (0, 1):  # each rank says it left, within seconds of the end of its work
        m = re.search(rf"^real-train: rank {rank} of 2: exited cleanly \(exit code 0, ([\d.]+) s to leave\)$",
                      p.stderr, flags=re.M)
        assert m and float(m.group(1)) < 10, p.stderr[-3000:]
    assert _left_after(tag, 10) == []
    results = json.loads((out / "train_results.json").read_text())
    assert results["world_size"] == 2
    assert results["global_batch_size"] == 4  # 1 per device x 2 accumulation x 2 processes
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["train_batch_size"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds left-over processes through /proc")
def test_ranks_die_with_a_launcher_killed_outright(work, tiny_llama, tmp_path):
    """SIGKILL to `accelerate launch` (a CI timeout, the OOM killer) takes both ranks with it, though torch
    elastic starts them in sessions of their own; the output directory's lock is free again at once."""
    out, tag = tmp_path / "ddp", uuid.uuid4().hex
    cmd = _launch_2proc(out, tiny_llama, work, tag, "--max_steps", "100000", "--per_device_train_batch_size", "1",
                        "--global_batch_size", "2", "--save_strategy", "no")
    log = tmp_path / "launch.log"
    with log.open("w") as fh:
        launcher = subprocess.Popen(cmd, cwd=REPO, env={**ENV, "REAL_TEST_TAG": tag}, stdout=fh,
                                    stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 480  # generous: start-up alone takes minutes on a loaded 2-core machine
        while "world size 2" not in log.read_text():  # both ranks past set-up, in the lock, training
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "training did not start within the time limit"
            time.sleep(0.2)
        ranks = [pid for pid in tagged_processes(tag) if pid != launcher.pid]
        assert len(ranks) >= 2
        launcher.kill()
        launcher.wait()
        assert _left_after(tag, 30, ranks) == []  # exited, so their files (the lock) closed
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
        for pid in tagged_processes(tag):  # never leave a rank behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
    # No rank holds the lock any more. Polled: once seen in CI, a rank whose memory was already gone (so
    # not found by its environment) still held the lock for a moment while the kernel closed its files.
    deadline = time.time() + 30
    while True:
        try:
            RunLock(out, "test", is_dir=True).acquire().release()
            break
        except UserError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
def test_rank_stops_with_one_line_when_the_main_process_outlasts_ddp_timeout(tmp_path):
    """A real two-process gloo group whose main rank is slower than the group's timeout: the waiting rank
    stops with a line naming what it waited for, instead of blocking or dumping a gloo trace."""
    result = tmp_path / "rank1.txt"
    code = textwrap.dedent(f"""
        import datetime, os, sys, time, types
        import torch.distributed as dist
        from real_fae_core.errors import UserError
        from real.training.trainer import on_main_then_share
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=3))
        args = types.SimpleNamespace(process_index=rank, world_size=2, ddp_timeout=3)
        try:
            on_main_then_share(args, lambda: time.sleep(60) if rank == 0 else None, "the resume decision")
        except UserError as exc:
            open({str(result)!r}, "w").write(str(exc))
            os._exit(0)
        os._exit(5)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank)], cwd=REPO, env=ENV) for rank in (0, 1)]
    try:
        assert procs[1].wait(timeout=120) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    line = result.read_text()
    assert "\n" not in line
    assert line.startswith("rank 1 of 2: gave up waiting for the other processes to share the resume decision")
    assert "ddp_timeout 3 s" in line and "raise --ddp_timeout" in line


@pytest.mark.slow
def test_killed_run_resumes_from_last_checkpoint(work, tiny_qwen, tmp_path):
    out = tmp_path / "qwen-sft"
    cmd = [REAL_TRAIN, *_args("qwen-sft.yaml", tiny_qwen, work / "pairs-sft", out, "--max_steps", "30",
                             "--save_steps", "1", "--save_total_limit", "3")]
    code = kill_once_saved(cmd, lambda: any(out.glob("checkpoint-*/trainer_state.json")),  # rotated away fast
                           what="its first checkpoint", timeout=240, cwd=REPO, env=ENV)
    assert code == -signal.SIGKILL
    assert not (out / "adapter_model.safetensors").exists()  # the run did not finish
    last = rt.last_complete_checkpoint(str(out))
    killed_at = json.loads((Path(last) / "trainer_state.json").read_text())["global_step"]
    assert 1 <= killed_at < 30

    p = _run(cmd)
    m = re.search(r"resuming from (\S+) \(global step (\d+)\)", p.stdout)
    assert m and m.group(1) == last and int(m.group(2)) == killed_at
    results = json.loads((out / "train_results.json").read_text())
    assert results["resumed_from"] == last
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 30
    steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert steps == list(range(1, 31))  # steps before the kill kept, none repeated, none lost
    assert (out / "adapter_model.safetensors").is_file()


def test_incomplete_checkpoint_is_skipped(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (tmp_path / "checkpoint-3").mkdir()  # killed while saving: no trainer state
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text('{"global_st')  # torn write
    assert rt.last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert rt.last_complete_checkpoint(str(tmp_path / "nothing")) is None


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------

def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch missing"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (bf16 DeepSpeed ZeRO-2 run)"
    if shutil.which("deepspeed") is None:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            return "deepspeed is not installed (pip install -e '.[deepspeed]')"
    return None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(_gpu_reason() is not None, reason=_gpu_reason() or "")
def test_gpu_bf16_lora_deepspeed_zero2(work, tiny_llama, tmp_path):
    out = tmp_path / "zero2"
    _run([ACCELERATE, "launch", "--config_file", "accelerate_configs/deepspeed_zero2.yaml", "--num_processes", "1",
          "--main_process_port", str(free_port()),
          "-m", "real.train", *_args("llama-real.yaml", tiny_llama, work / "pairs-real", out,
                                      "--bf16", "true", "--use_cpu", "false", "--dtype", "bfloat16",
                                      "--save_strategy", "no")], timeout=600)
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses) == 8 and all(l == l for l in losses)  # finite, one per step


def test_pairs_load_from_dir_or_jsonl(work):
    from_dir = rt.load_pairs(str(work / "pairs-real"))
    from_jsonl = rt.load_pairs(str(work / "pairs-real" / "pairs.jsonl"))
    assert from_dir["prompt"] == from_jsonl["prompt"] and from_dir["completion"] == from_jsonl["completion"]
    info = rt.check_variant(from_dir, "real", "x")
    assert info["by_kind"] == {"positive": 6, "negative": 6}
