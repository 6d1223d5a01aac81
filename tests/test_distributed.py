"""DeepSpeed ZeRO-2/3 and FSDP launched for real: two CPU processes, each engine against DDP.

Every launch is ``accelerate launch --config_file accelerate_configs/cpu_<engine>.yaml -m real.train``
on the tiny test Llama: the engines' losses and adapters equal DDP's, the saved adapter is a plain PEFT
adapter that PEFT, ``fae run``/``fae checkpoints`` and ``real-merge`` read, a checkpoint resumes to the
uninterrupted run's adapter, a killed rank stops the whole launch, and bad engine settings are refused
before any model loads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO, alive, free_port, tagged_processes, toy_training_records

from data_prep.cli import main as real_data
from fae.cli import main as fae
from real.merge import main as real_merge
from real.train import main as real_train
from real.training import engines
from real_fae_core.errors import UserError

pytest.importorskip("deepspeed", reason="the [deepspeed] extra is not installed")

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
CONFIGS = {"ddp": "cpu_2proc.yaml", "zero2": "cpu_deepspeed_zero2.yaml", "zero3": "cpu_deepspeed_zero3.yaml",
           "fsdp": "cpu_fsdp.yaml"}
ENGINE_NAME = {"ddp": "ddp", "zero2": "deepspeed-zero2", "zero3": "deepspeed-zero3", "fsdp": "fsdp"}
STEPS = 4
# Measured on this tiny model (fp32, gloo, 2 ranks): every engine's per-step loss is DDP's to within
# 1e-7 relative and its adapter to within 1e-8 (ZeRO sums gradients in flat buckets, another order of
# float additions than DDP). The tolerance leaves two orders of magnitude for other CPUs' kernels.
LOSS_RTOL = 1e-5
ADAPTER_RTOL = 1e-5


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_llama):
    d = tmp_path_factory.mktemp("dist")
    recs = d / "train.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in toy_training_records()))
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(d / "pairs"),
                      "--tokenizer", str(tiny_llama)]) == 0
    return d


def _cmd(engine: str, model, work: Path, out: Path, *extra) -> list[str]:
    return [ACCELERATE, "launch", "--config_file", f"accelerate_configs/{CONFIGS[engine]}",
            "--main_process_port", str(free_port()), "-m", "real.train",
            "--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"), "--model_name_or_path", str(model),
            "--dataset_name", str(work / "pairs"), "--output_dir", str(out), "--max_steps", str(STEPS),
            "--per_device_train_batch_size", "1", "--global_batch_size", "4", "--learning_rate", "1e-3",
            "--save_steps", "2", *map(str, extra)]


def _run(cmd, tag: str | None = None, timeout=600) -> subprocess.CompletedProcess:
    env = {**ENV, "REAL_TEST_TAG": tag} if tag else ENV
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def _losses(out: Path) -> list[float]:
    state = json.loads((out / "trainer_state.json").read_text())
    return [e["loss"] for e in state["log_history"] if "loss" in e]


def _adapter(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def _rel(a: dict, b: dict) -> float:
    num = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in b) ** 0.5
    return num / sum(float((b[k].double() ** 2).sum()) for k in b) ** 0.5


@pytest.fixture(scope="module")
def runs(work, tiny_llama, tmp_path_factory):
    """Each engine trained once (4 steps of global batch 4, a checkpoint every 2 steps); its stdout kept."""
    base = tmp_path_factory.mktemp("engines")
    done = {}
    for engine in CONFIGS:
        out = base / engine
        p = _run(_cmd(engine, tiny_llama, work, out))
        done[engine] = {"out": out, "stdout": p.stdout, "stderr": p.stderr}
    return done


def test_every_engine_leaves_cleanly_and_a_finished_run_relaunches_cleanly(runs, work, tiny_llama):
    """Both ranks of every engine say they exited cleanly; relaunching a finished FSDP or ZeRO-3 run (nothing
    to train) exits 0 on both ranks, not aborted by the interpreter's teardown with
    "terminate called without an active exception"."""
    for engine, r in runs.items():
        for rank in (0, 1):
            assert f"real-train: rank {rank} of 2: exited cleanly (exit code 0" in r["stderr"], (engine, r["stderr"][-2000:])
    for engine in ("fsdp", "zero3"):
        p = _run(_cmd(engine, tiny_llama, work, runs[engine]["out"]))
        assert "already holds the finished model of this run" in p.stdout
        assert "terminate called" not in p.stderr, p.stderr[-2000:]
        for rank in (0, 1):
            assert f"real-train: rank {rank} of 2: exited cleanly (exit code 0" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero2", "zero3", "fsdp"])
def test_engine_trains_like_ddp_and_saves_a_plain_adapter(engine, runs, tiny_llama):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, ddp = runs[engine]["out"], runs["ddp"]["out"]
    assert f"world size 2 (rank 0)" in runs[engine]["stdout"]
    assert f"engine {ENGINE_NAME[engine]}" in runs[engine]["stdout"]  # the engine really ran, not plain DDP
    results = json.loads((out / "train_results.json").read_text())
    assert results["world_size"] == 2 and results["global_batch_size"] == 4

    losses, reference = _losses(out), _losses(ddp)
    assert len(losses) == STEPS and all(x == x for x in losses)
    assert max(abs(x - y) / abs(y) for x, y in zip(losses, reference)) <= LOSS_RTOL, (losses, reference)

    saved, expected = _adapter(out), _adapter(ddp)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in expected.items()}  # no empty shard
    assert all(v.numel() > 0 for v in saved.values())
    assert _rel(saved, expected) <= ADAPTER_RTOL
    assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "LORA"

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Claim: The vaccine reduces the risk of severe disease.", return_tensors="pt")["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    with torch.no_grad():
        before = base(ids).logits
        after = PeftModel.from_pretrained(base, str(out)).eval()(ids).logits
    assert (after - before).abs().max() > 1e-4  # trained weights, loaded by PEFT as any adapter


@pytest.mark.slow
def test_sharding_is_measured_per_rank(runs):
    """ZeRO-3 and FSDP hold half the parameters on each of two ranks; ZeRO-2 half the optimizer state."""
    mem = {e: json.loads((r["out"] / "train_results.json").read_text())["per_rank_memory"] for e, r in runs.items()}
    full = mem["ddp"][0]["param_bytes"]
    for engine in CONFIGS:
        assert [m["rank"] for m in mem[engine]] == [0, 1]
        assert all(m["peak_rss_bytes"] > 0 for m in mem[engine])
    assert all(m["param_bytes"] == full for m in mem["ddp"] + mem["zero2"])
    for engine in ("zero3", "fsdp"):
        held = [m["param_bytes"] for m in mem[engine]]
        assert sum(held) <= full * 1.01 and max(held) <= full * 0.51, (engine, held, full)
    ddp_opt = mem["ddp"][0]["optimizer_state_bytes"]
    assert all(m["optimizer_state_bytes"] <= ddp_opt * 0.51 for m in mem["zero2"] + mem["zero3"] + mem["fsdp"])


@pytest.mark.slow
def test_zero3_adapter_is_read_by_fae_probe_checkpoints_and_merge(runs, work, tiny_llama, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = runs["zero3"]["out"]
    options = ["--limit", "2", "--rounds", "1", "--batch-size", "2", "--max-new-tokens", "8",
               "--no-label-probs", "--no-progress"]
    assert fae(["run", "--records", str(work / "train.jsonl"), "--output", str(tmp_path / "fae"),
                "--model", str(tiny_llama), "--adapter", str(out), *options]) == 0
    assert len((tmp_path / "fae" / "claims.jsonl").read_text().splitlines()) == 2
    assert fae(["probe", str(tmp_path / "fae"), "--model", str(tiny_llama), "--adapter", str(out),
                "--output", str(tmp_path / "probe"), "--bootstrap", "20", "--limit", "2"]) == 0
    assert (tmp_path / "probe" / "dirk.json").is_file()
    assert fae(["checkpoints", "--training-output", str(out), "--records", str(work / "train.jsonl"),
                "--output", str(tmp_path / "ev"), *options]) == 0
    rows = json.loads((tmp_path / "ev" / "checkpoints.json").read_text())["rows"]
    assert [r["step"] for r in rows] == [2, 4]

    assert real_merge(["--adapter", str(out), "--output", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama), str(out)).eval()
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, tuned(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero3", "fsdp"])
def test_sharded_checkpoint_resumes_to_the_uninterrupted_adapter(engine, runs, work, tiny_llama, tmp_path):
    """An output_dir holding only checkpoint-2 (what a run killed after its step-2 save leaves) resumes there
    and ends at the adapter of the uninterrupted run: same losses for steps 3-4, same weights."""
    full = runs[engine]["out"]
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(full / "checkpoint-2", out / "checkpoint-2")
    if engine == "zero3":
        assert any((out / "checkpoint-2").glob("global_step2/*optim_states.pt"))  # DeepSpeed's sharded state
    else:
        assert (out / "checkpoint-2" / "optimizer.bin").is_file()  # gathered by accelerate's FSDP save
    p = _run(_cmd(engine, tiny_llama, work, out))
    assert re.search(r"resuming from \S+checkpoint-2 \(global step 2\)", p.stdout)
    assert _losses(out)[-2:] == pytest.approx(_losses(full)[-2:], rel=LOSS_RTOL)
    assert _rel(_adapter(out), _adapter(full)) <= ADAPTER_RTOL


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds left-over processes through /proc")
def test_killing_one_rank_stops_the_whole_launch(work, tiny_llama, tmp_path):
    """SIGKILL to one ZeRO-3 rank mid-training: the other rank says in one line what happened, the launcher
    exits, and no process of the run is left, all within seconds."""
    out, tag = tmp_path / "killed", uuid.uuid4().hex
    cmd = _cmd("zero3", tiny_llama, work, out, "--max_steps", "100000", "--save_strategy", "no")
    log = tmp_path / "launch.log"
    with log.open("w") as fh:
        launcher = subprocess.Popen(cmd, cwd=REPO, env={**ENV, "REAL_TEST_TAG": tag}, stdout=fh,
                                    stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 480
        while "'loss'" not in log.read_text():  # both ranks are in the training loop
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "training did not start within the time limit"
            time.sleep(0.2)
        ranks = sorted(pid for pid in tagged_processes(tag) if pid != launcher.pid)
        assert len(ranks) == 2
        os.kill(ranks[-1], signal.SIGKILL)
        killed_at = time.time()
        launcher.wait(timeout=60)
        stopped_in = time.time() - killed_at
        left = [pid for pid in tagged_processes(tag) if alive(pid)]
    finally:
        for pid in tagged_processes(tag):  # never leave a rank behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
    text = log.read_text()
    assert launcher.returncode != 0 and left == [] and stopped_in < 30, (stopped_in, left)
    lines = [ln for ln in text.splitlines() if ln.startswith("real-train: error: rank 0 of 2: another process")]
    assert len(lines) == 1, text[-4000:]
    assert "no checkpoint was saved yet" in lines[0] and "run the same command again to resume" in lines[0]
    assert "internal error" not in text
    assert not (out / "adapter_model.safetensors").exists()


# ---------------------------------------------------------------------------
# Bad engine settings: one line naming the config file and key, before any model loads
# ---------------------------------------------------------------------------

def _config(tmp_path, text: str) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(text)
    return path


def _engine(tmp_path, config: str, **env) -> engines.Engine:
    engine = engines.current_engine({"WORLD_SIZE": "2", "LOCAL_RANK": "0", **env})
    engine.config_file = str(_config(tmp_path, config))
    return engine


def _refusal(engine, **kwargs) -> str:
    with pytest.raises(UserError) as err:
        engines.check_engine(engine, **{"use_peft": True, "gpu": False, **kwargs})
    assert "\n" not in str(err.value)
    return str(err.value)


def test_gpu_only_settings_are_refused_on_cpu(tmp_path):
    zero3 = "distributed_type: DEEPSPEED\nmixed_precision: bf16\nuse_cpu: false\n"
    e = _engine(tmp_path, zero3, ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="3",
                ACCELERATE_MIXED_PRECISION="bf16", ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL="true")
    msg = _refusal(e)
    assert msg.startswith(f"{e.config_file}:2: mixed_precision: bf16 is a GPU setting")
    assert "accelerate_configs/cpu_deepspeed_zero3.yaml" in msg
    engines.check_engine(e, use_peft=True, gpu=True)  # the same file is right on a GPU machine

    e = _engine(tmp_path, "deepspeed_config:\n  offload_optimizer_device: nvme\n", ACCELERATE_USE_DEEPSPEED="true",
                ACCELERATE_DEEPSPEED_ZERO_STAGE="2", ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE="nvme")
    assert _refusal(e).startswith(f"{e.config_file}:2: offload_optimizer_device: nvme offloads")
    e = _engine(tmp_path, "fsdp_config:\n  fsdp_offload_params: true\n", ACCELERATE_USE_FSDP="true",
                FSDP_OFFLOAD_PARAMS="true")
    assert _refusal(e).startswith(f"{e.config_file}:2: fsdp_offload_params: true offloads")
    e = _engine(tmp_path, "use_cpu: true\n", ACCELERATE_USE_FSDP="true", ACCELERATE_USE_CPU="True")
    assert _refusal(e).startswith(f"{e.config_file}:1: use_cpu: true makes accelerate drop FSDP")
    e = _engine(tmp_path, "", ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="2")
    assert "--cpu_bf16 false" in _refusal(e, cpu_bf16=True)
    engines.check_engine(e, use_peft=True, gpu=False)  # the CPU twin's settings pass


def test_engine_settings_that_save_no_adapter_are_refused(tmp_path, monkeypatch):
    e = _engine(tmp_path, "fsdp_config:\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n", ACCELERATE_USE_FSDP="true",
                FSDP_STATE_DICT_TYPE="SHARDED_STATE_DICT")
    assert _refusal(e).startswith(f"{e.config_file}:2: fsdp_state_dict_type: SHARDED_STATE_DICT saves no PEFT")
    engines.check_engine(e, use_peft=False, gpu=False)  # full fine-tuning: the sharded checkpoint is the model
    e = _engine(tmp_path, "deepspeed_config:\n  zero_stage: 4\n", ACCELERATE_USE_DEEPSPEED="true",
                ACCELERATE_DEEPSPEED_ZERO_STAGE="4")
    assert _refusal(e).startswith(f"{e.config_file}:2: zero_stage: 4 is no ZeRO stage")

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as where the package is not installed
    e = _engine(tmp_path, "distributed_type: DEEPSPEED\n", ACCELERATE_USE_DEEPSPEED="true",
                ACCELERATE_DEEPSPEED_ZERO_STAGE="2")
    assert _refusal(e).startswith(f"{e.config_file}:1: distributed_type: DEEPSPEED needs the deepspeed package")


def test_process_count_that_does_not_divide_the_batch_names_the_config(tmp_path):
    e = _engine(tmp_path, "num_machines: 1\nnum_processes: 3\n", ACCELERATE_USE_FSDP="true")
    e.num_processes = 3
    msg = engines.batch_problem(e, 4, 1)
    assert msg.startswith("global_batch_size 4 is not a multiple of per_device_train_batch_size 1 x 3 processes")
    assert f"({e.config_file}:2: num_processes)" in msg
    assert engines.batch_problem(e, 6, 2) is None


@pytest.mark.slow
def test_gpu_config_on_cpu_is_refused_before_the_model_loads(work, tiny_llama, tmp_path):
    """The 8-GPU ZeRO-3 config launched on two CPU processes: one line naming the file, its line and key;
    the output directory holds no adapter, no fingerprint, no checkpoint."""
    out = tmp_path / "refused"
    cmd = _cmd("zero3", tiny_llama, work, out)
    cmd[cmd.index("--config_file") + 1] = "accelerate_configs/deepspeed_zero3.yaml"
    cmd[cmd.index("--main_process_port"):cmd.index("--main_process_port")] = ["--num_processes", "2"]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("real-train: error:")]
    assert len(lines) == 1, p.stderr[-3000:]  # rank 0 says it; rank 1 exits with the same code, silently
    line_no = next(i for i, ln in enumerate((REPO / "accelerate_configs/deepspeed_zero3.yaml").read_text()
                                            .splitlines(), 1) if ln.startswith("mixed_precision:"))
    assert lines[0].startswith(f"real-train: error: accelerate_configs/deepspeed_zero3.yaml:{line_no}: "
                               "mixed_precision: bf16 is a GPU setting")
    assert "Loading weights" not in p.stderr + p.stdout
    assert not out.exists() or [f.name for f in out.iterdir()] in ([], [".lock"])


def test_real_train_refuses_before_loading_the_model(work, tiny_llama, tmp_path, monkeypatch, capsys):
    """In-process, with the environment `accelerate launch` gives a rank: refused with exit 2 and one line."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT")
    out = tmp_path / "o"
    code = real_train(["--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"), "--model_name_or_path",
                       str(tiny_llama), "--dataset_name", str(work / "pairs"), "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("real-train: error:")]
    assert len(lines) == 1 and "fsdp_state_dict_type: SHARDED_STATE_DICT saves no PEFT adapter" in lines[0]
    assert not (out / "adapter_model.safetensors").exists() and not (out / "run_fingerprint.json").exists()
