"""`fae checkpoints`: FAE of every ``checkpoint-N`` of a training output, and Acc / IS against the step.

Each checkpoint (a LoRA adapter saved by ``real-train`` or any TRL/Trainer
run) gets a full ``fae run`` of its own in ``OUTPUT/checkpoint-N/``, with the
`fae run` options given beside the command's own (``--records``, ``--limit``,
``--rounds``, ``--constrained-decoding`` ...; one parser of both, :func:`make_parser`). ``fae run`` resumes, so a rerun
skips the checkpoints already evaluated (no model is loaded for them) and
finishes a half-done one; the table is rebuilt from every run's
``metrics.json``:

- ``checkpoints.json`` / ``checkpoints.csv``: one row per step (:func:`checkpoint_row`);
- ``checkpoints.png``: Acc and IS against the training step.

The `fae run` options are parsed once (defaults < ``--config`` YAML < flags, as
`fae run` reads them); each checkpoint's run gets them with its own ``--output``
and ``--adapter``, and ``--model`` (when neither a flag
nor the YAML names one) is the adapter's base (``base_model_name_or_path``).
Each run's config.json stores this command line as given: rerunning it resumes.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from real_fae_core.atomicio import atomic_file, atomic_write_text
from real_fae_core.command import (CONFIG_FILE_HELP, CommandConfig, CommandResult, add_config_arguments, option,
                                   parse_with_config_file)
from real_fae_core.errors import UserError
from real_fae_core.flags import Refused
from fae.ablation import runner as fae_run
from fae.ablation.options import FaeRunArguments, options_of, require
from fae.ablation.runio import METRICS, write_json_atomic

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# table columns: the step, then the FAE numbers a training curve is read by
COLUMNS = ("step", "checkpoint", "Acc", "IS", "ER", "IO", "nei_rate_r1", "valid_rate")


def checkpoint_row(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """The numbers of one FAE run that a per-step curve shows (also logged by the training callback).

    Acc is a_0 (label accuracy at round 0); ``nei_rate_r1`` the share of
    NOT_ENOUGH_INFO answers once the cited evidence is removed (round 1);
    ``valid_rate`` the share of parseable answers at round 0.
    """
    nei = metrics.get("nei_answer_rate") or []
    invalid = metrics.get("invalid_rate") or []
    return {
        "Acc": metrics.get("label_accuracy"),
        "IS": metrics.get("IS"),
        "ER": metrics.get("ER"),
        "IO": metrics.get("IO"),
        "nei_rate_r1": nei[1] if len(nei) > 1 else None,
        "valid_rate": None if not invalid or invalid[0] is None else 1.0 - invalid[0],
    }


def find_checkpoints(training_output: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every ``checkpoint-N`` holding an adapter, by step.

    A checkpoint without ``adapter_config.json`` (full-weight training, or one
    killed while saving) is skipped with a note: it has no adapter to load.
    """
    root = Path(training_output)
    if not root.is_dir():
        raise UserError(f"--training-output {root}: not a directory")
    found = []
    for d in root.iterdir():
        m = CHECKPOINT.fullmatch(d.name)
        if not (m and d.is_dir()):
            continue
        if not (d / "adapter_config.json").is_file():
            print(f"fae checkpoints: skipping {d}: no adapter_config.json (not a LoRA adapter checkpoint, "
                  "or cut off while saving)", file=sys.stderr)
            continue
        found.append((int(m.group(1)), d))
    if not found:
        raise UserError(f"--training-output {root}: no checkpoint-N directory with an adapter")
    return sorted(found)


EPILOG = ("Every other option is a `fae run` option, given to each checkpoint's run (--records FILE "
          "required; --limit N, --rounds R, --max-new-tokens T, --constrained-decoding, --config eval.yaml ...).")
OWN_OPTIONS = ("training_output", "output", "plot")
# the `fae run` options each checkpoint's run takes from the command line: all but its output and adapter
RUN_OPTIONS = tuple(f.name for f in dataclasses.fields(FaeRunArguments) if f.name not in ("output", "adapter"))


@dataclasses.dataclass
class CheckpointsConfig(CommandConfig):
    """`fae checkpoints`: one `fae run` per checkpoint of ``training_output``, with ``run_options``
    (their ``output`` and ``adapter`` are set per checkpoint; ``model`` defaults to the adapter's base)."""

    training_output: str = option(metavar="DIR", help="a training output directory holding checkpoint-N/ adapters")
    output: str = option(metavar="DIR", help="where each checkpoint's run (checkpoint-N/), the table and plot go")
    run_options: FaeRunArguments = option(help="the `fae run` options of every checkpoint's run")
    plot: bool = option(True, help="write the table only")  # --no-plot


CONFIG = CheckpointsConfig


def make_parser(prog: str = "fae checkpoints") -> argparse.ArgumentParser:
    """The whole command line: this command's options (:data:`OWN_OPTIONS`), every `fae run` option but
    ``--output`` (here the table's directory) and ``--adapter`` (set per checkpoint: refused), each backend's
    under its heading, and ``--config`` (a `fae run` YAML file); built by the one generator."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EPILOG, allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_arguments(p, CheckpointsConfig, OWN_OPTIONS)
    add_config_arguments(p, FaeRunArguments, RUN_OPTIONS)
    p.add_argument("--config", metavar="YAML", help=CONFIG_FILE_HELP)
    p.add_argument("--adapter", action=Refused, reason="is set per checkpoint; give --training-output")
    return p


def parse_args(argv: list[str], prog: str = "fae checkpoints") -> tuple[CheckpointsConfig, dict[str, Any]]:
    """This command's options and the `fae run` options passed to each checkpoint's run (defaults < the
    ``--config`` YAML < the command line, as `fae run` reads them)."""
    parser = make_parser(prog)
    values, config_file, from_file = parse_with_config_file(parser, argv, [FaeRunArguments])
    own = {name: values.pop(name) for name in OWN_OPTIONS}
    # the YAML's output and adapter, if any, stay as `fae run` would read them: each checkpoint sets its own
    values.update(output=from_file.get("output"), adapter=from_file.get("adapter"))
    config = CheckpointsConfig(**own, run_options=options_of(parser, values))
    return config, {"command": shlex.join([*prog.split(), *argv]), "config_file": config_file}


def base_model_of(checkpoint: Path) -> str:
    cfg = json.loads((checkpoint / "adapter_config.json").read_text(encoding="utf-8"))
    base = cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None
    if not base:
        raise UserError(f"{checkpoint / 'adapter_config.json'}: no base_model_name_or_path; pass --model")
    return str(base)


def checkpoint_options(config: CheckpointsConfig, step_dir: Path, checkpoint: Path) -> FaeRunArguments:
    """The `fae run` options of one checkpoint: the parsed options with its output, adapter and model."""
    base = config.run_options
    opts = dataclasses.replace(base, output=str(step_dir), adapter=str(checkpoint),
                               model=base.model or base_model_of(checkpoint))
    require(opts)
    return opts


def run(config: CheckpointsConfig, *, command: str | None = None, config_file: str | None = None) -> CommandResult:
    """FAE of every checkpoint (resumed: an evaluated one loads no model), then the table and plot;
    ``summary["rows"]`` is the table."""
    out = Path(config.output)
    checkpoints = find_checkpoints(config.training_output)
    rows = []
    for step, ckpt in checkpoints:
        step_dir = out / ckpt.name
        if (step_dir / METRICS).is_file():
            print(f"fae checkpoints: {ckpt.name}: evaluated before, checking it is the same run", file=sys.stderr)
        else:
            print(f"fae checkpoints: {ckpt.name} (step {step})", file=sys.stderr)
        fae_run.run(checkpoint_options(config, step_dir, ckpt), command=command, config_file=config_file)
        metrics = json.loads((step_dir / METRICS).read_text(encoding="utf-8"))
        rows.append({"step": step, "checkpoint": ckpt.name, **checkpoint_row(metrics)})
    write_table(rows, out)
    if config.plot:
        plot_steps(rows, out / "checkpoints.png")
    print(f"fae checkpoints: wrote {out}/checkpoints.json, checkpoints.csv"
          + (", checkpoints.png" if config.plot else ""), file=sys.stderr)
    outputs = {"table": str(out / "checkpoints.json"), "csv": str(out / "checkpoints.csv")}
    if config.plot:
        outputs["plot"] = str(out / "checkpoints.png")
    return CommandResult(outputs=outputs, summary={"rows": rows})


def write_table(rows: Sequence[Mapping[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "checkpoints.json", {"columns": list(COLUMNS), "rows": list(rows)})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    atomic_write_text(out / "checkpoints.csv", buf.getvalue())


def plot_steps(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Acc and IS against the training step; an undefined IS is left out (a gap), the legend below the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for key, style in (("Acc", "o-"), ("IS", "s-")):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        ax.plot([s for s, _ in pts], [v for _, v in pts], style, lw=1.6, label=key)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("score")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    with atomic_file(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return path
