"""The distributed engine a launch asked for (DDP, DeepSpeed ZeRO, FSDP), checked before any model loads.

``accelerate launch --config_file F`` hands F's settings to every rank as
environment variables (``ACCELERATE_USE_DEEPSPEED``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``,
``ACCELERATE_USE_FSDP``, ``FSDP_STATE_DICT_TYPE``, ...). This module reads them
back, refuses the combinations that would fail late or silently do something
else, each as one line naming the config file and its key, and holds the one
adjustment CPU-only FSDP needs (:func:`fsdp_on_cpu`). The engines themselves
are accelerate's DeepSpeed and FSDP plugins, driven by the Trainer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from real_fae_core.errors import UserError

ENGINES = ("single", "ddp", "deepspeed", "fsdp")


def _true(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


@dataclass
class Engine:
    """What the launch asked for, from the environment ``accelerate launch`` gives each rank."""

    kind: str  # one of ENGINES
    num_processes: int
    config_file: str  # the accelerate config the launch read, for messages
    zero_stage: int | None = None
    env: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The engine as messages and records name it: the kind, with DeepSpeed's ZeRO stage (``deepspeed-zero2``)."""
        if self.kind == "deepspeed":
            return f"deepspeed-zero{self.zero_stage}"
        return self.kind

    def where(self, key: str) -> str:
        """``file:line: key`` (or ``file: key`` when the key is not written in the file)."""
        return f"{_locate(self.config_file, key)}: {key}"


def launch_config_file(env=None, ppid: int | None = None) -> str:
    """The ``--config_file`` of the ``accelerate launch`` that started this rank (its parent), or its default."""
    env = os.environ if env is None else env
    ppid = os.getppid() if ppid is None else ppid
    try:
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    for i, arg in enumerate(argv):
        if arg in ("--config_file", "--config-file") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--config_file=", "--config-file=")):
            return arg.split("=", 1)[1]
    cache = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                               "huggingface")
    default = os.path.join(env.get("ACCELERATE_CONFIG_HOME", os.path.join(cache, "accelerate")), "default_config.yaml")
    return default if os.path.isfile(default) else "the accelerate launch options"


def _locate(config_file: str, key: str) -> str:
    """``config_file:line`` of ``key`` when the file is readable and names it, else ``config_file``."""
    leaf = key.rsplit(".", 1)[-1]
    try:
        lines = Path(config_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return config_file
    pattern = re.compile(rf"^\s*\"?{re.escape(leaf)}\"?\s*:")
    for number, line in enumerate(lines, 1):
        if pattern.match(line):
            return f"{config_file}:{number}"
    return config_file


def current_engine(env=None) -> Engine:
    """The engine of this launch (``single`` for one process without DeepSpeed/FSDP)."""
    env = dict(os.environ if env is None else env)
    world = int(env.get("WORLD_SIZE", "1") or 1)
    launched = "LOCAL_RANK" in env or world > 1
    config = launch_config_file(env) if launched else "the accelerate launch options"
    if _true(env.get("ACCELERATE_USE_DEEPSPEED")):
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        if stage is None and env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none") != "none":
            stage = _ds_json(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).get("zero_optimization", {}).get("stage")
        try:
            stage = int(stage if stage not in (None, "auto") else 2)
        except ValueError:
            raise UserError(f"{_locate(config, 'zero_stage')}: zero_stage: {stage!r} is not a number") from None
        return Engine("deepspeed", world, config, stage, env)
    if _true(env.get("ACCELERATE_USE_FSDP")):
        return Engine("fsdp", world, config, None, env)
    return Engine("ddp" if world > 1 else "single", world, config, None, env)


def _ds_json(path: str) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"deepspeed_config_file {path!r} is not a readable JSON file ({exc})") from None
    return value if isinstance(value, dict) else {}


def check_engine(engine: Engine, *, use_peft: bool, gpu: bool, cpu_bf16: bool = False) -> None:
    """Refuse a launch that cannot work (or would quietly train something else), before any model loads."""
    env = engine.env
    if engine.kind not in ("deepspeed", "fsdp"):
        return
    what = "DeepSpeed" if engine.kind == "deepspeed" else "FSDP"
    if cpu_bf16 and not gpu:
        raise UserError(f"cpu_bf16 (recipe or --cpu_bf16): bf16 autocast is for one process or DDP; under {what} "
                        f"({engine.config_file}) bf16 would change the dtype the engine keeps the weights in: "
                        "pass --cpu_bf16 false")
    if engine.kind == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise UserError(f"{engine.where('distributed_type')}: DEEPSPEED needs the deepspeed package, which is not "
                        "installed: pip install -e \".[deepspeed]\" (no CUDA toolkit needed)")
    if _true(env.get("ACCELERATE_USE_CPU")):
        raise UserError(f"{engine.where('use_cpu')}: true makes accelerate drop {what} and train plain DDP; set "
                        "use_cpu: false (without a GPU the ranks still train on the CPU: accelerate_configs/cpu_"
                        f"{'deepspeed_zero' + str(engine.zero_stage) if engine.kind == 'deepspeed' else 'fsdp'}.yaml)")
    if not gpu:
        twin = (f"accelerate_configs/cpu_deepspeed_zero{engine.zero_stage}.yaml" if engine.kind == "deepspeed"
                else "accelerate_configs/cpu_fsdp.yaml")
        precision = env.get("ACCELERATE_MIXED_PRECISION", "no")
        if precision not in ("no", ""):
            raise UserError(f"{engine.where('mixed_precision')}: {precision} is a GPU setting and no GPU is found; "
                            f"use 'no' (fp32) on CPU, as {twin} does")
        for key, var in (("offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),
                         ("offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE")):
            device = env.get(var, "none") if engine.kind == "deepspeed" else "none"
            if device not in ("none", ""):
                raise UserError(f"{engine.where(key)}: {device} offloads from GPU memory and no GPU is found "
                                f"(the weights already live in CPU memory); use none, as {twin} does")
        if engine.kind == "fsdp" and _true(env.get("FSDP_OFFLOAD_PARAMS")):
            raise UserError(f"{engine.where('fsdp_offload_params')}: true offloads from GPU memory and no GPU is "
                            f"found; use false, as {twin} does")
    if engine.kind == "deepspeed" and engine.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"{engine.where('zero_stage')}: {engine.zero_stage} is no ZeRO stage; use 2 (optimizer "
                        "and gradients sharded) or 3 (parameters too)")
    if not use_peft:
        return
    if engine.kind == "fsdp":
        kind = env.get("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
        if "FULL_STATE_DICT" not in kind:
            raise UserError(f"{engine.where('fsdp_state_dict_type')}: {kind} saves no PEFT adapter at the end (the "
                            "Trainer writes one only from a FULL_STATE_DICT gathered from the shards); use "
                            "FULL_STATE_DICT")


@contextmanager
def said_once():
    """A refusal every rank reaches alike is printed by rank 0 only; the other ranks exit with the same code."""
    try:
        yield
    except UserError as exc:
        if os.environ.get("RANK", "0") != "0":
            raise SystemExit(exc.exit_code) from None
        raise


def batch_problem(engine: Engine, global_batch: int, per_device: int) -> str | None:
    """Why ``global_batch`` cannot be split over this launch's processes, naming the config's num_processes."""
    denom = per_device * engine.num_processes
    if global_batch % denom == 0:
        return None
    where = engine.where("num_processes") if engine.num_processes > 1 else "one process"
    return (f"global_batch_size {global_batch} is not a multiple of per_device_train_batch_size {per_device} "
            f"x {engine.num_processes} processes ({where}); change the process count or the batch")


def fsdp_on_cpu(engine: Engine, gpu: bool) -> bool:
    """Let accelerate apply FSDP to a CPU process group; True when it had to.

    accelerate builds its FSDP plugin only for a multi-device state
    (MULTI_GPU, MULTI_XPU, ...); the gloo group of CPU-only ranks is
    MULTI_CPU, where it would silently train plain DDP. torch's FSDP2 itself
    shards over a CPU device mesh, so the state is marked multi-device before
    the Trainer builds its Accelerator; the device stays the CPU and the
    backend gloo. Called after the training arguments set up the process group.
    """
    if engine.kind != "fsdp" or gpu:
        return False
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = PartialState()
    if state.distributed_type != DistributedType.MULTI_CPU:
        return False
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    return True


def local_memory(model, optimizer=None) -> dict:
    """Bytes of parameters (and optimizer state) this rank holds, and its peak resident memory.

    Sharded parameters count only their local part: a DeepSpeed ZeRO-3
    partition (``ds_tensor``), an FSDP2 ``DTensor``'s local shard.
    """
    import resource

    import torch

    def held(p) -> int:
        if hasattr(p, "ds_tensor"):  # ZeRO-3: p.data is an empty placeholder outside forward/backward
            return p.ds_tensor.numel() * p.ds_tensor.element_size()
        local = p.to_local() if hasattr(p, "to_local") else p
        return local.numel() * local.element_size()

    params = list(model.parameters())
    out = {"param_bytes": sum(held(p) for p in params),
           "trainable_param_bytes": sum(held(p) for p in params if p.requires_grad),
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if optimizer is not None:
        seen, total = set(), 0
        for opt in (optimizer, getattr(optimizer, "optimizer", None)):
            for state in (getattr(opt, "state", None) or {}).values():
                for value in (state.values() if isinstance(state, dict) else ()):
                    if isinstance(value, torch.Tensor) and id(value) not in seen and value.dim() > 0:
                        seen.add(id(value))
                        local = value.to_local() if hasattr(value, "to_local") else value
                        total += local.numel() * local.element_size()
        out["optimizer_state_bytes"] = total
    return out
